"""Data parallelism and ZeRO: DDP, or FSDP2 `fully_shard` per block plus the root.

How the plan's zero_stage maps onto the runtime (the cost model must assume the same):

=========  ======================================================================================
ZeRO-0     Replicated params, grads and optimizer state; gradients all-reduced (averaged) over
           dp. Pure data parallelism (pp = tp = cp = 1, fp32, no offload) uses torch DDP;
           otherwise FSDP2 on the 2-D (dp_replicate = dp, dp_shard = 1) mesh, i.e. HSDP with
           shard groups of one rank = an all-reduce of full gradients.
ZeRO-1     FSDP2 fully_shard(reshard_after_forward=False) with gradient sync and resharding
           deferred to the last micro-batch (trainer._sync_context): one all-gather and one
           reduce-scatter per step, full fp32 gradients accumulated between them, optimizer
           state (and the fp32 master weights) sharded 1/dp. FSDP2 has no optimizer-only mode
           and ZeroRedundancyOptimizer cannot go through DCP; this is ZeRO-1's traffic and at
           most its memory.
ZeRO-2     FSDP2 fully_shard(reshard_after_forward=False): weights stay gathered from the first
           forward to the last backward, gradients are reduce-scattered every micro-batch so
           they stay sharded. Memory: 2Ψ gathered weights + (4+4+8)Ψ/dp.
ZeRO-3     FSDP2 fully_shard(reshard_after_forward=True): parameters are freed after each
           block's forward and all-gathered again in backward (one extra all-gather per step).
HSDP       parallel.dp_shard with ZeRO-1/2/3: the same, on the 2-D (dp_replicate, dp_shard) mesh
           (torchtitan's HSDP): states shard over dp_shard ranks, gathers and reduce-scatters
           run inside the shard group, then FSDP2 all-reduces each 1/dp_shard gradient shard
           across the dp_replicate groups.
=========  ======================================================================================

bf16 and fp16 runs use FSDP2's MixedPrecisionPolicy(param_dtype=bf16 or fp16,
reduce_dtype=fp32) at every stage (ZeRO-0 included, through the HSDP path), or reduce_dtype=bf16
where the plan's grad_reduce_dtype asks (bf16/fp8 plans only; DDP runs only fp32 plans, whose
reductions are fp32, so no DDP comm hook is needed), fp16 with dynamic
loss scaling (loss_scaling.py); offload.params uses CPUOffloadPolicy, offload.optimizer alone a
host optimizer over device-resident FSDP2 shards (offload.py).
Gradients are averaged over dp (FSDP2's default divide factor, DDP's average), over dp x cp
under context parallelism (fsdp_mesh).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autoplan.plan import Offload, Precision, ReduceDtype
from autoplan.plan_rules import data_parallel_wrappers
from autoplan.runtime.mesh import ParallelDims, with_world_timeout
from autoplan.runtime.offload import offload_policy, wants_offload


def uses_ddp(dims: ParallelDims, precision: Precision, offload: Offload) -> bool:
    """Pure ZeRO-0 data parallelism in fp32 runs on torch DDP (the fastest path): the rule
    the cost model prices by (plan_rules.data_parallel_wrappers)."""
    return bool(_wrappers(dims, precision, offload)[0])


def uses_fsdp(dims: ParallelDims, precision: Precision, offload: Offload) -> bool:
    """FSDP2 wraps the model whenever gradients need a dp reduction that DDP does not do, for
    mixed precision / offload (which only FSDP2 provides here), and for sharded experts
    (plan_rules.data_parallel_wrappers)."""
    return bool(_wrappers(dims, precision, offload)[1])


def _wrappers(dims: ParallelDims, precision: Precision, offload: Offload) -> tuple[Any, Any]:
    return data_parallel_wrappers(dims.dp, dims.tp, dims.pp, dims.cp, dims.ep * dims.etp,
                                  dims.zero_stage, precision == Precision.FP32,
                                  wants_offload(offload))


def reshard_after_forward(zero_stage: int) -> bool:
    """ZeRO-3 frees parameters after forward; ZeRO-0/1/2 keep them until backward."""
    return zero_stage >= 3


def fsdp_mesh(world_mesh, dims: ParallelDims):
    """1-D dp_shard mesh (ZeRO >= 1), the 2-D HSDP mesh (dp_replicate, dp_shard) under
    parallel.dp_shard, or the 2-D HSDP mesh with shard size 1 (ZeRO-0).

    With cp > 1 the cp ranks join the data-parallel group (torchtitan's dp_shard_cp): each
    holds other tokens of the same samples, so gradients are averaged over dp x cp, and
    ZeRO-1/2/3 shard over dp x cp, as the cost model's `shard = dp * cp` assumes.
    """
    if dims.cp > 1:
        from torch.distributed.device_mesh import DeviceMesh

        if dims.hsdp:  # replicate over dp_replicate, shard over dp_shard x cp
            shard_cp = with_world_timeout(world_mesh["dp_shard", "cp"]._flatten("dp_shard_cp"))
            return DeviceMesh._concatenate([world_mesh["dp_replicate"], shard_cp])
        # one of dp_replicate / dp_shard is 1, so this is the dp x cp group
        dp_cp = with_world_timeout(world_mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"))
        if dims.zero_stage == 0:
            return DeviceMesh._concatenate([dp_cp, world_mesh["dp_shard"]])
        return dp_cp
    if dims.zero_stage == 0 or dims.hsdp:
        return world_mesh["dp_replicate", "dp_shard"]
    return world_mesh["dp_shard"]


def reduce_dtype(precision: Precision, grad_reduce: ReduceDtype | None) -> torch.dtype:
    """The dtype FSDP2 reduces gradients in: bf16 where the plan asks (plan_rules allows it
    for bf16/fp8 plans only), else fp32 (autoplan's default, RuntimeTraits.reduce_bytes_*)."""
    if grad_reduce is ReduceDtype.BF16:
        return torch.bfloat16
    return torch.float32


def apply_fsdp(
    model: nn.Module, world_mesh, dims: ParallelDims, precision: Precision, offload: Offload,
    grad_reduce: ReduceDtype | None = None,
) -> nn.Module:
    """fully_shard each block, then the root (embedding, final norm and head), in place."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if precision != Precision.FP32:
        low = torch.float16 if precision == Precision.FP16 else torch.bfloat16  # fp8: bf16 rest
        mp = MixedPrecisionPolicy(param_dtype=low,
                                  reduce_dtype=reduce_dtype(precision, grad_reduce))
    kwargs = {
        "mesh": fsdp_mesh(world_mesh, dims),
        "mp_policy": mp,
        "offload_policy": offload_policy(offload),
        "reshard_after_forward": reshard_after_forward(dims.zero_stage),
    }
    for block in model.layers.values():
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def apply_ddp(model: nn.Module, world_mesh) -> nn.Module:
    """torch DDP over the dp_replicate group (pure data parallelism only)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=world_mesh["dp_replicate"].get_group())
