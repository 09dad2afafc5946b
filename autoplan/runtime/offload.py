"""CPU offload of sharded parameters, gradients and optimizer state via FSDP2's CPUOffloadPolicy.

With offload the sharded fp32 parameters, their gradients and therefore the optimizer state and
the optimizer step live in host memory; FSDP2 copies each layer's shard to the device for its
all-gather. Pinned host memory needs CUDA, so it is requested only when CUDA is available
(pinning fails on a CPU-only host; see notes/torch-cpu-gloo.md).
"""

from __future__ import annotations

import torch

from autoplan.plan import Offload


def wants_offload(offload: Offload) -> bool:
    """Either plan flag turns on FSDP2 offload (FSDP2 offloads params, grads and optimizer together)."""
    return offload.optimizer or offload.params


def offload_policy(offload: Offload):  # -> OffloadPolicy
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not wants_offload(offload):
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
