"""Seconds per micro-batch one block costs its pipeline stage, by part: its compute as its
runtime runs it (compute.layer_times_s with the runtime's kernels, casts and host), the MoE, MLA
and ring-attention extras, recompute, the expert all-to-alls, and its tensor- and
context-parallel communication (block_comm.py). stage_time.py scales a block to its stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.cost import activations, block_comm, compute, elementwise, moe, moe_dispatch, te_ring
from autoplan.cost.recompute_time import deepseek_v3_recompute_s, module_recompute_s
from autoplan.cost.rows import Rows
from autoplan.cost.runtimes import RuntimeTraits, SelectiveKind
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.plan_table import RC_FULL, RC_SELECTIVE


def block_times_s(model: ModelSpec, profile: ClusterProfile, precision: str, b: np.ndarray,
                  tp: np.ndarray, cp: np.ndarray, eager: bool, runtime: RuntimeTraits,
                  parts: dict[str, np.ndarray], sp: np.ndarray | bool = False,
                  unit_host_s: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """compute.layer_times_s of one block as this runtime runs it (also what `autoplan
    profile` compares its measured blocks with); `unit_host_s`: the host seconds of the
    block's FSDP unit per micro-batch, where the runtime's host runs ahead of the device."""
    act_scale = 2.0 if precision == "fp32" else 1.0
    noncore = np.sum([parts[k] for k in activations.NONCORE_PARTS], axis=0) * act_scale
    tokens = np.asarray(b, float) * model.seq_len / np.asarray(cp, float)
    casts = (elementwise.fp8_cast_bytes(model, tokens, tp) if precision == "fp8"
             else np.zeros_like(tokens))
    core = runtime.attention_precision(precision)  # the fused core's own dtype
    if core != precision and core == "fp32" and not eager:
        casts = casts + elementwise.attention_cast_bytes(model, tokens, tp, cp)
    if runtime.eager_elementwise:
        moved = elementwise.eager_elementwise_bytes(model, tokens, tp, np.asarray(sp),
                                                    runtime.fused_norm, precision)
    else:
        moved = elementwise.fused_elementwise_bytes(model, parts, tokens, tp, np.asarray(sp),
                                                    precision)
    early_stop = (runtime.recompute_early_stop and not runtime.reentrant_recompute
                  and model.moe is None and model.mla is None)
    return compute.layer_times_s(model, profile, gemm_peak(profile, precision, runtime), b, tp,
                                 cp, noncore, parts["core"] * act_scale, eager,
                                 causal_skip=runtime.causal_attention_skip and not eager,
                                 attention_kernel=f"{runtime.attention_kernel}@{core}",
                                 elementwise_bytes=moved,
                                 attention_peak=profile.device.peak(core),
                                 extra_elementwise_bytes=casts,
                                 host_runs_ahead=runtime.host_runs_ahead, unit_host_s=unit_host_s,
                                 recompute_skips_last_gemm=early_stop)


def fsdp_unit_host_s(r: Rows, runtime: RuntimeTraits, profile: ClusterProfile
                     ) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2's host seconds per unit and micro-batch (hooks, copies), split by where they are
    priced: (per block, with the block's ops in layer_times_s; per micro-batch, beside the
    data-parallel communication). Where the host runs ahead the blocks' units go with their
    ops and only the root unit of each model chunk (embedding, final norm, head) is charged
    apart; otherwise every unit is charged apart, in series."""
    unit = np.where(r.fsdp, profile.efficiency.fsdp_unit_overhead_s, 0.0)
    if runtime.host_runs_ahead:
        return unit, r.vpp * unit
    return np.zeros_like(unit), (r.layers_max + r.vpp) * unit


def profile_gemm_peak(profile: ClusterProfile, precision: str) -> float:
    """The peak the profile's GEMMs of `precision` are priced at: the device's, an FP8 one's
    scaled by what its cuBLASLt FP8 GEMMs reach against the curve (Efficiency.fp8_matmul)."""
    scale = profile.efficiency.fp8_matmul if precision == "fp8" else 1.0
    return profile.device.peak(precision) * scale


def gemm_peak(profile: ClusterProfile, precision: str, runtime: RuntimeTraits) -> float:
    """The peak a block's GEMMs run at: the profile's for the plan's precision, an fp8 run's
    scaled again by the runtime's fp8 kernels (RuntimeTraits.fp8_gemm_efficiency)."""
    scale = runtime.fp8_gemm_efficiency if precision == "fp8" else 1.0
    return profile_gemm_peak(profile, precision) * scale


def sixteen_bit_peak(profile: ClusterProfile, precision: str) -> float:
    """The peak attention and the output layer run at: an fp8 run's 16-bit peak (MFU takes the
    plan precision's own peak, estimate.estimate_table)."""
    return profile.device.peak("bf16" if precision == "fp8" else precision)


@dataclass(frozen=True)
class BlockCosts:
    """Seconds per micro-batch one block costs its stage, by part: what stage_time.stage_s
    scales by the stage's layer count, and by its recomputed layers for the recompute terms."""

    block_s: dict[str, np.ndarray]
    """block_times_s with the MoE/MLA and userbuffers extras joined (forward, backward, full,
    each policy's recompute, and the GEMM shares)."""
    wgrad: np.ndarray
    """Weight-gradient GEMMs: one per forward GEMM at its shape (the forward GEMM time with the
    MoE/MLA delta); backward's input gradients, attention core and element-wise work have none."""
    recompute: np.ndarray
    """A recomputed layer's extra seconds under the row's policy (0 without recompute)."""
    a2a: np.ndarray
    """MoE dispatch and combine all-to-alls, forward and backward (0 for dense models)."""
    a2a_recompute: np.ndarray
    """The all-to-alls a recomputed layer runs again (selective recompute of the MoE layer)."""
    tp: block_comm.TensorParallelCosts
    """The block's tensor-parallel collectives and how far overlap hides them."""
    cp: np.ndarray
    """Context-parallel ring exchanges of a layer."""
    cp_recompute: np.ndarray
    """The ring exchanges a recomputed layer runs again (0 where it keeps the attention core)."""


def block_extras_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                   runtime: RuntimeTraits, lt: dict[str, np.ndarray], eager: bool = False
                   ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Device seconds a block adds to compute.layer_times_s' forward, backward and full
    recompute ({forward, backward, full}), and the MoE/MLA forward delta alone: userbuffers'
    SM margin, PyTorch's ring-attention merges, Transformer Engine's ring steps and merges
    (te_ring), the expert GEMMs, router and MLA projections, an fp8 run's expert casts."""
    # Transformer Engine's pipelined userbuffers overlap runs the two row-parallel forward
    # GEMMs on the SMs its reduce-scatter leaves them (a full recompute's forward too)
    margin = block_comm.userbuffers_margin_s(model, profile, runtime, r, lt)
    extra = {"forward": margin, "backward": 0.0 * margin, "full": margin}
    if runtime.cp_exchange == "torch-ring":  # the ring's fp32 merges, a recompute's too
        ring = elementwise.torch_ring_elementwise_bytes(model, model.seq_len / r.cp * r.b,
                                                        r.tp, r.cp, runtime.kv_repeated)
        fwd, bwd = (compute.memory_time_s(ring[k], profile) for k in ("forward", "backward"))
        extra = {"forward": extra["forward"] + fwd, "backward": extra["backward"] + bwd,
                 "full": extra["full"] + fwd}
    if runtime.cp_exchange == "te-p2p":  # its ring steps' kernels and merges, a recompute's too
        fwd, bwd = te_ring.block_extra_s(model, profile, r, precision, runtime, lt, eager)
        extra = {"forward": extra["forward"] + fwd, "backward": extra["backward"] + bwd,
                 "full": extra["full"] + fwd}
    if model.moe is None and model.mla is None:
        return extra, 0.0 * lt["gemm_forward"]
    # expert GEMMs, router, MLA projections at the peak the block's own GEMMs ran at (fp8 in an
    # fp8 run: DeepSeek-V3 §3.3.1 runs every Linear's Fprop, Dgrad and Wgrad in FP8), since the
    # delta replaces those GEMMs
    # (a runtime whose experts stay 16-bit in an fp8 run, RuntimeTraits.fp8_experts, runs
    # theirs at the 16-bit peak)
    peak = gemm_peak(profile, precision, runtime)
    expert_peak = peak if runtime.fp8_experts else sixteen_bit_peak(profile, precision)
    delta = moe.block_forward_delta_s(model, profile, peak, r, expert_peak)
    extra = {"forward": extra["forward"] + delta, "backward": 2.0 * delta,
             "full": extra["full"] + delta}
    if precision == "fp8" and model.moe is not None:  # the experts' casts, not the MLP's
        casts = compute.memory_time_s(moe.fp8_cast_delta_bytes(
            model, r, runtime.ep_dispatch_bytes, routed=runtime.fp8_experts), profile)
        extra = {"forward": extra["forward"] + casts / 3.0,
                 "backward": extra["backward"] + casts * 2.0 / 3.0,
                 "full": extra["full"] + casts / 3.0}
    return extra, delta


def recompute_extra_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                      runtime: RuntimeTraits, lt: dict[str, np.ndarray],
                      parts: dict[str, np.ndarray], a2a_forward: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """A recomputed layer's extra seconds under the row's policy, and the MoE token exchange it
    runs again (`a2a_forward`, the forward's share of a block's): the runtime's selective
    policy, Megatron's recompute.modules, or the full forward."""
    by_module = r.rc_modules > 0
    # the MoE layers' forward GEMMs a recompute of the whole layer re-runs (recompute.modules
    # moe): the MLP GEMMs the mean block's MoE share stands for, plus the MoE delta
    moe_gemm = moe.moe_share(model) * (lt["mlp_gemm_forward"] + moe.moe_block_forward_s(
        model, profile, gemm_peak(profile, precision, runtime), r))
    selective_t = np.where(by_module, module_recompute_s(lt, parts, r.rc_modules, moe_gemm),
                           lt[runtime.selective.value])
    # ... and its forward dispatch and combine, which a recompute of the whole block (full)
    # re-runs too: the checkpointed forward holds the MoE layer's dispatch and combine
    # (Megatron's and torchtitan's full recompute checkpoint the block)
    moe_again = ((r.recompute == RC_SELECTIVE) & ((r.rc_modules & activations.MOE) > 0)) | (
        r.recompute == RC_FULL)
    a2a_rec = np.where(moe_again, a2a_forward, 0.0)
    rec_extra = np.where(r.recompute == RC_SELECTIVE, selective_t,
                         np.where(r.recompute == RC_FULL, lt["full"], 0.0))
    return rec_extra, a2a_rec


def block_costs(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                eager: bool, runtime: RuntimeTraits, parts: dict[str, np.ndarray]
                ) -> BlockCosts:
    """What one block costs its stage per micro-batch, by part (BlockCosts)."""
    lt = block_times_s(model, profile, precision, r.b, r.tp, r.cp, eager, runtime, parts, r.sp,
                       fsdp_unit_host_s(r, runtime, profile)[0])
    if runtime.selective is SelectiveKind.DEEPSEEK_V3:
        lt["deepseek-v3"] = deepseek_v3_recompute_s(model, profile, gemm_peak(
            profile, precision, runtime), r, lt, parts)
    extra, delta = block_extras_s(model, profile, r, precision, runtime, lt, eager)
    # device work: it joins the block's kernels before the host's share is weighed
    lt = {**lt, **{k: compute.with_host(lt[f"{k}_device"] + x, lt[f"{k}_host"],
                                        runtime.host_runs_ahead) for k, x in extra.items()}}
    a2a = moe_dispatch.all_to_all_per_block_s(model, profile, r, runtime.ep_dispatch_bytes,
                                     dedup_nodes=runtime.ep_dispatcher == "deepep",
                                     all_gather=runtime.ep_dispatcher == "allgather")
    # the all-to-alls' forward half (two of four); the allgather dispatcher's forward legs
    a2a_forward = (moe_dispatch.all_gather_dispatch_s(model, profile, r, forward_only=True)
                   if runtime.ep_dispatcher == "allgather" and model.moe is not None
                   else a2a / 2.0)
    rec_extra, a2a_rec = recompute_extra_s(model, profile, r, precision, runtime, lt, parts,
                                           a2a_forward)
    cp_layer, cp_rec = block_comm.context_parallel_costs(model, profile, r, runtime, lt, precision)
    return BlockCosts(block_s=lt, wgrad=lt["gemm_forward"] + delta, recompute=rec_extra, a2a=a2a,
                      a2a_recompute=a2a_rec,
                      tp=block_comm.tensor_parallel_costs(model, profile, r, runtime, lt, parts),
                      cp=cp_layer, cp_recompute=cp_rec)
