"""CPU offload: PCIe traffic and CPU optimizer time (ZeRO-Offload, Ren et al. 2021, section 4;
ZeRO-Infinity, Rajbhandari et al. 2021, for parameters).

Optimizer offload sends each step's gradient shard to the host (overlapped with backward), runs
Adam on the CPU, and copies the updated 16-bit weights back. Parameter offload streams the weight
shard to the GPU in forward and again in backward, for every micro-batch.
"""

from __future__ import annotations

import numpy as np

from autoplan.hardware import ClusterProfile


def optimizer_offload_time_s(
    shard_params: np.ndarray, gpus_per_host: np.ndarray, weight_bytes: np.ndarray | float,
    grad_copy_bytes: np.ndarray | float, profile: ClusterProfile, hideable_s: np.ndarray,
    copy_back: np.ndarray | bool = True,
) -> np.ndarray:
    """Exposed seconds per step: CPU Adam on this GPU's shard (the host's optimizer throughput
    is shared by its GPUs), the weight copy back (none where the host steps the parameters the
    device streams in, `copy_back` False), and the gradient copy not hidden by backward.

    The gradient crosses PCIe in the dtype the host optimizer steps on, `grad_copy_bytes` per
    element (HOST_GRAD_BYTES), not the weights' 16 bits. The two copies and CPU Adam are
    summed: DeepSpeed's fused CPU-Adam + copy-back path (DeepSpeedCPUAdam.step with
    fp16_param_groups, which overlapped the copy with the update tile by tile) is commented out
    in DeepSpeed 0.19 (stage_1_and_2.py `_optimizer_step`: "the C++ side copy &
    synchronize is not working correctly"), which steps and then copies."""
    shard = np.asarray(shard_params, float)
    pcie = profile.host.pcie_bytes_per_s
    cpu = shard / (profile.host.optimizer_params_per_s / np.asarray(gpus_per_host, float))
    grads_down = shard * np.asarray(grad_copy_bytes, float) / pcie
    weights_up = np.where(copy_back, shard * np.asarray(weight_bytes, float) / pcie, 0.0)
    return cpu + weights_up + np.maximum(0.0, grads_down - hideable_s)


def param_offload_time_s(
    shard_params: np.ndarray, microbatches: np.ndarray, weight_bytes: np.ndarray | float,
    profile: ClusterProfile, hideable_s: np.ndarray,
) -> np.ndarray:
    """Exposed seconds per step of streaming the weight shard in for forward and backward."""
    total = 2.0 * np.asarray(microbatches, float) * np.asarray(shard_params, float) * weight_bytes
    return np.maximum(0.0, total / profile.host.pcie_bytes_per_s - hideable_s)



HOST_GRAD_BYTES = 4.0
"""Bytes per gradient element copied to the host for the CPU optimizer: the fp32 master
gradient in every runtime priced here. DeepSpeed ZeRO-1/2 casts each 16-bit partition to its
master dtype on the device first (stage_1_and_2.py `async_inplace_copy_grad_to_fp32_buffer_
from_gpu`: `.to(master_weights_and_grads_dtype)`, fp32 by default); Megatron-Core's
HybridDeviceOptimizer copies the grad buffer into the fp32 CPU parameter's gradient with
`non_blocking=True`, and a non-blocking copy converts on the GPU before the transfer
(ATen/native/cuda/Copy.cu: "If non_blocking is true - type conversions are performed on the
GPU"); FSDP2 (autoplan's runtime, torchtitan) reduces into fp32 sharded gradients, which
autoplan's HostOffloadOptimizer copies as they are (runtime/offload.py)."""
