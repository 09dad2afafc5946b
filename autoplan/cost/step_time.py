"""Step time by part: compute and recompute on the slowest pipeline stage, tensor- and
context-parallel collectives, the pipeline bubble and sends, data-parallel/ZeRO traffic left
exposed, offload and the optimizer step.

Every part is seconds per optimizer step on the critical (slowest) stage, whose seconds per
micro-batch stage_time.py prices; dp_comm.py prices the data-parallel collectives; comm.py,
compute.py, pipeline.py and offload.py hold the formulas and their sources.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoplan.cost import comm, compute, offload, params, pipeline
from autoplan.cost.dp_comm import data_parallel_s
from autoplan.cost.recompute_time import recompute_flops_per_step
from autoplan.cost.rows import Rows
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.cost.stage_time import critical_stage_s
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, Curve, scale_figure
from autoplan.model_spec import ModelSpec, NormKind
from autoplan.plan_table import GPIPE

TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "pp_bubble", "pp_comm", "dp_comm",
              "offload", "optimizer", "ep_comm")
"""ep_comm: the MoE all-to-all dispatch and combine (cost/moe.py); 0 for dense models."""
ADAM_BYTES_PER_PARAM = 28.0
"""HBM traffic of the fused Adam kernel per parameter: fp32 parameter, gradient, m and v read
(16), parameter, m and v written (12). What a runtime's step moves besides it is
RuntimeTraits.optimizer_extra_bytes."""


def priced_profile(profile: ClusterProfile, runtime: RuntimeTraits) -> ClusterProfile:
    """The profile as this runtime meets it: host costs per op only where it pays them, and no
    data-parallel overlap where it does not overlap."""
    eff = profile.efficiency
    if not runtime.eager_host_overheads:
        eff = replace(eff, op_overhead_s=0.0, dtensor_op_overhead_s=0.0,
                      checkpoint_op_overhead_s=0.0, selective_op_overhead_s=0.0,
                      fsdp_unit_overhead_s=0.0, optimizer_overhead_s=0.0,
                      dtensor_optimizer_overhead_s=0.0, tp_collective_overhead_s=0.0)
    if not runtime.overlap_dp_comm:
        eff = replace(eff, overlap=0.0)
    device = profile.device
    if runtime.comm_reserved_sms:
        if device.sm_count is None or runtime.comm_reserved_sms >= device.sm_count:
            raise ConfigError("runtime.comm_reserved_sms", f"got {runtime.comm_reserved_sms}",
                              f"profile {profile.name} needs a device.sm_count above it")
        left = device.sm_count - runtime.comm_reserved_sms
        share = left / device.sm_count
        eff = replace(
            eff, matmul=Curve(eff.matmul.x, tuple(y * share for y in eff.matmul.y)),
            attention_forward={k: scale_figure(v, share)
                               for k, v in (eff.attention_forward or {}).items()} or None,
            attention_backward={k: scale_figure(v, share)
                                for k, v in (eff.attention_backward or {}).items()} or None,
            attention_head_dims={d: f.scaled(share)
                                 for d, f in (eff.attention_head_dims or {}).items()} or None)
        device = replace(device, sm_count=left)
    return replace(profile, efficiency=eff, device=device)


def pipeline_comm_s(model: ModelSpec, profile: ClusterProfile, r: Rows,
                    runtime: RuntimeTraits) -> np.ndarray:
    """Seconds per step of the pipeline's sends between stages and the tied head's gradient
    sum between the first and last stage."""
    gpn = profile.gpus_per_node
    sp_div = np.where(r.sp, r.tp, 1.0)
    p2p_bytes = r.weight_bytes * model.seq_len / r.cp * r.b * model.hidden_size / sp_div
    # scatter/gather (RuntimeTraits.pipeline_scatter_gather): each tp rank sends its slice of a
    # replicated tensor and the receiver all-gathers the slices inside its node
    scatter = runtime.pipeline_scatter_gather & ~r.sp & (r.tp > 1)
    gather = np.where(scatter, comm.collective_time_s(
        comm.ALL_GATHER, p2p_bytes, r.tp, comm.intra_node(np.ones_like(r.tp), r.tp, gpn),
        profile, per_node=comm.members_per_node(np.ones_like(r.tp), r.tp, gpn)), 0.0)
    # a pipeline that spans nodes sends some boundaries over the network: price the slowest
    p2p = comm.p2p_time_s(p2p_bytes / np.where(scatter, r.tp, 1.0),
                          comm.intra_node(r.tp * r.cp * r.dp, r.pp, gpn), profile) + gather
    out = np.where(r.pp > 1, 2.0 * (r.m * r.vpp + r.pp - 1.0) * p2p, 0.0)
    # first and last stage sum their copies' (FSDP-sharded) gradients: a tied head's, or the
    # embedding the MTP module's loss stage keeps again (step_memory.mtp_embedding_copy;
    # Megatron-Core finalize_model_grads: `share_embeddings_and_output_weights or
    # mtp_num_layers`); under ZB-V and DualPipe both copies sit on rank 0 and add up locally
    if (model.tie_embeddings or model.mtp_layers > 0) and not runtime.dualpipe:
        head = r.vocab * model.hidden_size / r.tp
        tied = head * r.reduce_bytes / np.where(r.fsdp & (r.zero >= 1), r.shard, 1.0)
        out += np.where((r.pp > 1) & ~r.v_shape, comm.collective_time_s(
            comm.ALL_REDUCE, tied, np.full_like(r.pp, 2.0),
            comm.intra_node(r.tp * r.cp * r.dp, r.pp, gpn), profile), 0.0)
    return out


def optimizer_step_s(model: ModelSpec, profile: ClusterProfile, r: Rows,
                     runtime: RuntimeTraits, crit: dict[str, np.ndarray], psi: np.ndarray,
                     held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per step of (offload traffic and the host's optimizer step, the device's
    optimizer step and its gradient accumulation) for a rank stepping `psi` parameters (its
    shard of them under ZeRO) in `held` blocks' tensors."""
    eff = profile.efficiency
    m = r.m
    shard_params = psi / np.where(r.zero >= 1, r.shard, 1.0)
    gpus_per_host = np.minimum(r.world, profile.gpus_per_node)
    # FSDP2's parameter offload steps the optimizer on the host as well, on the host copies
    # FSDPParam streams in (no copy back)
    fsdp2_host = r.offload_params & runtime.fsdp2_offload
    host_step = r.offload_optimizer | fsdp2_host
    # the copies move the parameters as the runtime keeps them: FSDP2's fp32 shards (FSDPParam
    # copies the fp32 shard to the device before casting it; autoplan's HostOffloadOptimizer
    # copies the fp32 master into it)
    weight_bytes = np.where(runtime.fp32_sharded_params & r.fsdp, 4.0, r.weight_bytes)
    # autoplan's HostOffloadOptimizer copies the gradients in step(), after backward, and
    # waits for them (runtime/offload.py): nothing hides that copy
    after_backward = r.offload_optimizer & ~r.offload_params & runtime.own_runtime_rules
    offloaded = (
        np.where(host_step, offload.optimizer_offload_time_s(
            shard_params, gpus_per_host, weight_bytes, offload.HOST_GRAD_BYTES, profile,
            np.where(after_backward, 0.0, crit["backward"] * eff.overlap),
            copy_back=~fsdp2_host), 0.0)
        + np.where(r.offload_params, offload.param_offload_time_s(
            psi / r.shard, m, weight_bytes, profile, m * crit["t_mb"] * eff.overlap), 0.0))
    tensors = held * params.tensors_per_layer(model) + params.end_tensors(model)
    on_device = np.where(
        host_step, 0.0,
        compute.memory_time_s(
            shard_params * (ADAM_BYTES_PER_PARAM + runtime.optimizer_extra_bytes)
            # the gradient buffer: whole under DDP and the distributed optimizer (ZeRO 0-1),
            # a shard under Megatron-FSDP (ZeRO-2/3)
            + np.where(runtime.zeroes_grad_buffer,
                       np.where(r.zero >= 2, shard_params, psi) * r.grad_bytes, 0.0), profile)
    ) + tensors * (eff.optimizer_overhead_s + np.where(
        r.fsdp | (r.tp > 1), eff.dtensor_optimizer_overhead_s, 0.0))
    # BF16_Optimizer adds each micro-batch's 16-bit gradients into its buffer between the
    # pipeline's instructions, on the compute stream: nothing hides it
    accumulate = m * compute.memory_time_s(psi * r.accumulate_bytes, profile)
    return offloaded, on_device + accumulate


def time_by_part(
    model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str, eager: bool,
    runtime: RuntimeTraits, parts: dict[str, np.ndarray], psi: np.ndarray,
) -> dict[str, np.ndarray]:
    """time_<part> (seconds per step) and time_step, with t_mb (seconds per micro-batch)."""
    profile = priced_profile(profile, runtime)
    crit = critical_stage_s(model, profile, r, precision, eager, runtime, parts)
    m = r.m
    out: dict[str, np.ndarray] = {}
    out["time_compute"] = m * crit["compute"]
    out["time_recompute"] = m * crit["recompute"]
    # sequence parallelism's partial norm gradients: summed once per step by the trainer, or
    # per micro-batch where FSDP reduces every micro-batch (ZeRO-2/3: FSDP2 redistributes a
    # Partial gradient to Replicate inside its reduce-scatter)
    per_norm = 2.0 if model.norm is NormKind.LAYERNORM else 1.0
    norm_tensors = per_norm * (2.0 * crit["layers"] + crit["holds_head"])
    every_mb = r.fsdp & (r.zero >= 2) & ~r.unsharded_accumulation
    out["time_tp_comm"] = m * crit["tp"] + norm_tensors * crit["norm_grad"] * np.where(
        every_mb, m, 1.0)
    out["time_cp_comm"] = m * crit["cp"]
    out["time_ep_comm"] = m * crit["ep"]
    out["time_pp_bubble"] = dualpipe_bubble_s(r, crit) if runtime.dualpipe else \
        pipeline.bubble_fraction(r.schedule, r.pp, r.vpp, m) * m * crit["t_fill"]
    out["time_pp_comm"] = pipeline_comm_s(model, profile, r, runtime)
    out["time_dp_comm"], psi, held = data_parallel_s(model, profile, r, precision, runtime,
                                                     crit, psi)
    out["time_offload"], out["time_optimizer"] = optimizer_step_s(model, profile, r, runtime,
                                                                  crit, psi, held)
    slots = profile.host.compute_slots
    if slots:  # more ranks than cores on a node time-share them (CPU runs)
        share = np.maximum(1.0, np.minimum(r.world, profile.gpus_per_node) / slots)
        for k in TIME_PARTS:
            out[f"time_{k}"] = out[f"time_{k}"] * share
    out["time_step"] = np.sum([out[f"time_{k}"] for k in TIME_PARTS], axis=0)
    return out


def dualpipe_bubble_s(r: Rows, crit: dict[str, np.ndarray]) -> np.ndarray:
    """pipeline.dualpipe_bubble_s of the slowest rank: F and B its forward and backward
    (recompute in it) per micro-batch, split from its time in the ratio of its blocks' forward
    and backward compute; W its weight-gradient GEMMs (crit["wgrad"]: the forward GEMMs' time,
    no communication in it)."""
    f_share = crit["forward"] / np.maximum(crit["forward"] + crit["backward"], 1e-30)
    forward = f_share * crit["t_mb"]
    return pipeline.dualpipe_bubble_s(r.pp, forward, crit["t_mb"] - forward, crit["wgrad"])


__all__ = ["ADAM_BYTES_PER_PARAM", "GPIPE", "TIME_PARTS", "recompute_flops_per_step",
           "time_by_part"]
