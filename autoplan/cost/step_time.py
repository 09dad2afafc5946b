"""Step time by part: compute and recompute on the slowest pipeline stage, tensor- and
context-parallel collectives, the pipeline bubble and sends, data-parallel/ZeRO traffic left
exposed, offload and the optimizer step.

Every part is seconds per optimizer step on the critical (slowest) stage; comm.py, compute.py,
pipeline.py and offload.py hold the formulas and their sources.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoplan.cost import comm, compute, memory, moe, mtp, offload, params, pipeline
from autoplan.cost.recompute_time import (
    deepseek_v3_recompute_s,
    module_recompute_s,
    recompute_flops_per_step,
)
from autoplan.cost.rows import Rows, recomputed_layers
from autoplan.cost.runtimes import RuntimeTraits, SelectiveKind
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, Curve, scale_figure
from autoplan.model_spec import ModelSpec, NormKind
from autoplan.plan_table import GPIPE, RC_FULL, RC_SELECTIVE

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
                      dtensor_optimizer_overhead_s=0.0)
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
                                for k, v in (eff.attention_backward or {}).items()} or None)
        device = replace(device, sm_count=left)
    return replace(profile, efficiency=eff, device=device)


def block_times_s(model: ModelSpec, profile: ClusterProfile, precision: str, b: np.ndarray,
                  tp: np.ndarray, cp: np.ndarray, eager: bool, runtime: RuntimeTraits,
                  parts: dict[str, np.ndarray], sp: np.ndarray | bool = False,
                  unit_host_s: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """compute.layer_times_s of one block as this runtime runs it (also what `autoplan
    profile` compares its measured blocks with); `unit_host_s`: the host seconds of the
    block's FSDP unit per micro-batch, where the runtime's host runs ahead of the device."""
    act_scale = 2.0 if precision == "fp32" else 1.0
    noncore = np.sum([parts[k] for k in memory.NONCORE_PARTS], axis=0) * act_scale
    tokens = np.asarray(b, float) * model.seq_len / np.asarray(cp, float)
    casts = (compute.fp8_cast_bytes(model, tokens, tp) if precision == "fp8"
             else np.zeros_like(tokens))
    core = runtime.attention_precision(precision)  # the fused core's own dtype
    if core != precision and core == "fp32" and not eager:
        casts = casts + compute.attention_cast_bytes(model, tokens, tp, cp)
    if runtime.eager_elementwise:
        elementwise = compute.eager_elementwise_bytes(model, tokens, tp, np.asarray(sp),
                                                      runtime.fused_norm, precision)
    else:
        elementwise = compute.fused_elementwise_bytes(model, parts, tokens, tp, np.asarray(sp),
                                                      precision)
    return compute.layer_times_s(model, profile, gemm_peak(profile, precision, runtime), b, tp,
                                 cp,
                                 noncore, parts["core"] * act_scale, eager,
                                 causal_skip=runtime.causal_attention_skip and not eager,
                                 attention_kernel=f"{runtime.attention_kernel}@{core}",
                                 elementwise_bytes=elementwise,
                                 attention_peak=profile.device.peak(core),
                                 extra_elementwise_bytes=casts,
                                 host_runs_ahead=runtime.host_runs_ahead, unit_host_s=unit_host_s,
                                 recompute_skips_last_gemm=(
                                     runtime.recompute_early_stop and not runtime.reentrant_recompute
                                     and model.moe is None and model.mla is None))


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


def gemm_peak(profile: ClusterProfile, precision: str, runtime: RuntimeTraits) -> float:
    """The peak a block's GEMMs run at: the profile's for the plan's precision, an fp8 run's
    scaled by the runtime's fp8 kernels (RuntimeTraits.fp8_gemm_efficiency)."""
    scale = runtime.fp8_gemm_efficiency if precision == "fp8" else 1.0
    return profile.device.peak(precision) * scale


def sixteen_bit_peak(profile: ClusterProfile, precision: str) -> float:
    """The peak attention and the output layer run at: an fp8 run's 16-bit peak (MFU takes the
    plan precision's own peak, estimate.estimate_table)."""
    return profile.device.peak("bf16" if precision == "fp8" else precision)


def _stages(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str, eager: bool,
            runtime: RuntimeTraits, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of the slowest of the first, largest and last stage."""
    peak = sixteen_bit_peak(profile, precision)  # the output layer stays 16-bit in fp8 runs
    lt = block_times_s(model, profile, precision, r.b, r.tp, r.cp, eager, runtime, parts, r.sp,
                       fsdp_unit_host_s(r, runtime, profile)[0])
    if runtime.selective is SelectiveKind.DEEPSEEK_V3:
        lt["deepseek-v3"] = deepseek_v3_recompute_s(model, profile, gemm_peak(
            profile, precision, runtime), r, lt, parts)
    # Transformer Engine's pipelined userbuffers overlap runs the two row-parallel forward
    # GEMMs on the SMs its reduce-scatter leaves them (a full recompute's forward too)
    margin = userbuffers_margin_s(model, profile, runtime, r, lt)
    extra = {"forward": margin, "backward": 0.0 * margin, "full": margin}
    if model.moe is not None or model.mla is not None:  # expert GEMMs, router, MLA projections
        # at the peak the block's own GEMMs ran at (fp8 in an fp8 run: DeepSeek-V3 §3.3.1 runs
        # every Linear's Fprop, Dgrad and Wgrad in FP8), since the delta replaces those GEMMs
        delta = moe.block_forward_delta_s(model, profile, gemm_peak(profile, precision,
                                                                    runtime), r)
        extra = {"forward": extra["forward"] + delta, "backward": 2.0 * delta,
                 "full": extra["full"] + delta}
        if precision == "fp8" and model.moe is not None:  # the experts' casts, not the MLP's
            casts = compute.memory_time_s(moe.fp8_cast_delta_bytes(
                model, r, runtime.ep_dispatch_bytes), profile)
            extra = {"forward": extra["forward"] + casts / 3.0,
                     "backward": extra["backward"] + casts * 2.0 / 3.0,
                     "full": extra["full"] + casts / 3.0}
    else:
        delta = 0.0 * lt["gemm_forward"]
    # device work: it joins the block's kernels before the host's share is weighed
    lt = {**lt, **{k: compute.with_host(lt[f"{k}_device"] + x, lt[f"{k}_host"],
                                        runtime.host_runs_ahead) for k, x in extra.items()}}
    # weight-gradient GEMMs per block: one per forward GEMM at its shape (the GEMM forward time
    # with the MoE/MLA delta); backward also holds the input gradients, the attention core's
    # backward and element-wise work, which have none
    wgrad = lt["gemm_forward"] + delta
    a2a = moe.all_to_all_per_block_s(model, profile, r, runtime.ep_dispatch_bytes,
                                     dedup_nodes=runtime.ep_dispatcher == "deepep")
    by_module = r.rc_modules > 0
    # the MoE layers' forward GEMMs a recompute of the whole layer re-runs (recompute.modules
    # moe): the MLP GEMMs the mean block's MoE share stands for, plus the MoE delta
    moe_gemm = moe.moe_share(model) * (lt["mlp_gemm_forward"] + moe.moe_block_forward_s(
        model, profile, gemm_peak(profile, precision, runtime), r))
    selective_t = np.where(by_module, module_recompute_s(lt, parts, r.rc_modules, moe_gemm),
                           lt[runtime.selective.value])
    # ... and its dispatch and combine all-to-alls, half of a block's four
    moe_again = (r.recompute == RC_SELECTIVE) & ((r.rc_modules & memory.MOE) > 0)
    a2a_rec = np.where(moe_again, a2a / 2.0, 0.0)
    rec_extra = np.where(r.recompute == RC_SELECTIVE, selective_t,
                         np.where(r.recompute == RC_FULL, lt["full"], 0.0))
    tokens = model.seq_len / r.cp * r.b
    gpn = profile.gpus_per_node
    tp_nodes = comm.members_per_node(np.ones_like(r.tp), r.tp, gpn)
    tpc = comm.tensor_parallel_time_s(model, r.weight_bytes * tokens * model.hidden_size,
                                      4.0 * tokens, r.tp, r.sp,
                                      comm.intra_node(np.ones_like(r.tp), r.tp, gpn), profile,
                                      per_node=tp_nodes)
    # what the runtime's overlap leaves exposed, never hiding more than the block's GEMMs take
    # (forward, plus backward's two GEMMs per forward one; the recomputed forward's likewise)
    exposed_tp = runtime.tp_exposed_share(r.tp, r.sp)
    exposed_rec = runtime.tp_recompute_exposed_share(r.tp, r.sp)
    # async dgrad hides behind the column-parallel GEMMs' weight gradients only
    tp_hideable = np.where(runtime.tp_async_dgrad(r.tp, r.sp), lt["column_gemm_forward"],
                           3.0 * lt["gemm_forward"])
    # Megatron's selective re-runs only the attention core on the Q, K, V it kept: no
    # collective again; the runtimes that re-run the norms re-gather their SP outputs
    selective_tp = 0.0 * tpc["recompute_selective"] if runtime.selective.value == \
        "attention-core" else tpc["recompute_selective"]
    full_tp = tpc["recompute_reentrant" if runtime.reentrant_recompute else "recompute_full"]
    tp_rec = np.where(r.recompute == RC_FULL, full_tp,
                      np.where(r.recompute == RC_SELECTIVE, np.where(
                          by_module, np.where((r.rc_modules & memory.MLP) > 0,
                                              parts.get("dense_share", 1.0)
                                              * tpc["recompute_full"] / 2.0, 0.0),
                          selective_tp), 0.0))
    cp_inside = comm.intra_node(r.tp, r.cp, gpn)
    cp_nodes = comm.members_per_node(r.tp, r.cp, gpn)
    cp_layer = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                            profile, per_node=cp_nodes)
    cp_rec = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                          profile, recompute_gathers=1.0,
                                          per_node=cp_nodes) - cp_layer
    logit_t = compute.logits_times_s(model, profile, peak, r.b, r.tp, r.cp, r.vocab,
                                     runtime.loss_bytes(precision))
    embed_t = embedding_grad_s(model, profile, runtime, r)

    # multi-token prediction (cost/mtp.py) on the stage with the loss: one more block each
    # depth, priced as the stage's blocks, plus eh_proj, the MoE kind's excess and a second
    # head with its cross-entropy (fwd + bwd: 3x the forward extras)
    d_mtp = float(model.mtp_layers)
    mtp_x = 3.0 * mtp.extra_forward_s(model, profile, gemm_peak(profile, precision, runtime), r) \
        + d_mtp * logit_t
    mtp_a2a = mtp.extra_all_to_all_s(model, a2a)

    # NCCL's collectives slow the compute they hide behind (comm.contention_s); Transformer
    # Engine's userbuffers overlap runs its own kernels (ring exchanges on the copy engines), and
    # SMs a runtime reserves for communication are priced for the whole step (priced_profile)
    tp_by_nccl = np.where(runtime.tp_comm_overlap_method == "userbuffers",
                          runtime.tp_async_dgrad(r.tp, r.sp), True)
    # userbuffers' bulk overlaps (4 of a block's 10 collectives, the QKV and fc1 backward) run
    # on SMs of their own beside the GEMM, as NCCL does; its ring exchanges copy on the copy
    # engines and its pipelined reduce-scatters keep their SMs apart (userbuffers_margin_s)
    ub_bulk = np.where(tp_by_nccl, 0.0, USERBUFFERS_BULK_SHARE)
    reserved = runtime.comm_reserved_sms > 0

    def stage(layers: np.ndarray, extra: np.ndarray, tp_ends: np.ndarray,
              extra_a2a: np.ndarray | float = 0.0, embed: np.ndarray | float = 0.0
              ) -> dict[str, np.ndarray]:
        n = recomputed_layers(layers, r)
        layer_hidden = layers * np.minimum((1.0 - exposed_tp) * tpc["layer"], tp_hideable)
        tp_hidden = layer_hidden + n * np.minimum((1.0 - exposed_rec) * tp_rec,
                                                  lt["gemm_forward"])
        contended = np.where(tp_by_nccl, tp_hidden,
                             np.minimum(ub_bulk * layers * tpc["layer"], layer_hidden))
        # all-to-alls hidden behind another micro-batch's compute as far as the runtime
        # overlaps them (RuntimeTraits.ep_comm_overlap), never more than that compute
        ep_hidden = runtime.ep_comm_overlap * np.minimum(
            layers * a2a + n * a2a_rec + extra_a2a, layers * (lt["forward"] + lt["backward"]))
        return {
            "compute": layers * (lt["forward"] + lt["backward"] + lt["dtensor"]) + extra
                       + embed,
            "recompute": n * rec_extra,
            "tp": layers * tpc["layer"] + n * tp_rec + tp_ends - tp_hidden
                  + comm.contention_s(contended, profile),
            "cp": layers * cp_layer + n * np.where(
                by_module & ((r.rc_modules & memory.CORE_ATTN) == 0), 0.0, cp_rec),
            "ep": layers * a2a + n * a2a_rec + extra_a2a - ep_hidden
                  + (0.0 if reserved else comm.contention_s(ep_hidden, profile)),
            "forward": layers * lt["forward"],
            "backward": layers * lt["backward"],
            # the head's and MTP's GEMMs: a third of their forward + backward is weight gradient
            "wgrad": layers * wgrad + extra / 3.0,
            "layers": layers + 0.0 * extra,
        }

    loss_first = (r.pp == 1) | r.v_shape
    head_first = np.where(loss_first, 1.0, 0.0)
    head_last = 1.0 - head_first
    stages = [stage(r.layers_first + d_mtp * head_first, head_first * (logit_t + mtp_x),
                    tpc["embedding"] + head_first * (1.0 + d_mtp) * tpc["head"],
                    head_first * mtp_a2a, embed_t),
              stage(r.layers_max, 0.0 * r.layers_max, 0.0 * r.layers_max),
              stage(r.layers_last + d_mtp * head_last, head_last * (logit_t + mtp_x),
                    head_last * (1.0 + d_mtp) * tpc["head"], head_last * mtp_a2a)]
    if runtime.dualpipe:  # rank 0 holds the first and the last stage (RuntimeTraits.dualpipe);
        # without a pipeline the one stage is the whole model, head included
        piped = r.pp > 1
        ends = {k: np.where(piped, (stages[0][k] + stages[2][k]) / 2.0, stages[0][k])
                for k in stages[0]}
        stages = [ends, stages[1], ends]
    per_mb = [s["compute"] + s["recompute"] + s["tp"] + s["cp"] + s["ep"] for s in stages]
    slowest = np.argmax(np.stack(per_mb), axis=0)
    crit = {k: np.choose(slowest, [s[k] for s in stages]) for k in stages[0]}
    crit["t_mb"] = np.choose(slowest, per_mb)
    # the bubble: a synchronous pipeline's first micro-batch crosses every rank before the
    # slowest runs the other m - 1, so the idle time is (sum of the ranks' t - t_max), which is
    # (pp - 1) t_max for equal ranks (Narayanan et al. 2021 §2.2). Every rank fills its share
    # in its own time: an embedding- or loss-only stage briefly, a lighter end stage less than
    # the slowest; ranks between the two ends are bounded by the largest.
    pp = np.maximum(r.pp, 2.0)
    filled = (per_mb[0] + per_mb[2] + (pp - 2.0) * per_mb[1] - crit["t_mb"]) / (pp - 1.0)
    crit["t_fill"] = np.minimum(filled, crit["t_mb"])
    crit["holds_head"] = np.choose(slowest, [head_first, 0.0 * head_first, 1.0 - head_first])
    crit["norm_grad"] = tpc["norm_grad"]
    return crit


def embedding_grad_s(model: ModelSpec, profile: ClusterProfile, runtime: RuntimeTraits,
                     r: Rows) -> np.ndarray:
    """Seconds per micro-batch the embedding's dense gradient costs its stage beyond the lookup's
    backward: torch's embedding backward (F.embedding, which Megatron's VocabParallelEmbedding
    and torchtitan's both call) zero-fills a dense gradient of the rank's vocab/tp x h table
    (embedding_dense_backward: `at::zeros({num_weights, ...})`) before it adds the looked-up
    rows, and a runtime that adds gradients into its own buffer (RuntimeTraits.
    adds_into_grad_buffer) reads it again and reads and writes the buffer."""
    elements = r.vocab / r.tp * model.hidden_size
    add = (r.weight_bytes + 2.0 * r.grad_bytes) if runtime.adds_into_grad_buffer else 0.0
    return compute.memory_time_s(elements * (r.weight_bytes + add), profile)


USERBUFFERS_BULK_SHARE = 0.4
"""Share of a block's sequence-parallel collective time Transformer Engine's userbuffers runs
as bulk overlaps (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad: 4 of the 10 equal collectives
RuntimeTraits.tp_exposed_share counts)."""


def userbuffers_margin_s(model: ModelSpec, profile: ClusterProfile, runtime: RuntimeTraits,
                         r: Rows, lt: dict[str, np.ndarray]) -> np.ndarray:
    """Extra forward seconds per block of the row-parallel GEMMs (attention output
    projection; the dense MLP's second) that Transformer Engine's pipelined userbuffers
    overlap runs beside its reduce-scatter with set_sm_margin: on sm_count - n SMs, so
    sm_count / (sm_count - n) times as long (RuntimeTraits.userbuffers_proj_sms,
    userbuffers_fc2_sms). Only where userbuffers runs (sequence parallelism, tp >= 2) on a
    profile that knows its SM count; a routed-expert MLP's GEMMs are grouped, not userbuffers'."""
    sms = profile.device.sm_count
    zero = 0.0 * lt["gemm_forward"]
    if runtime.tp_comm_overlap_method != "userbuffers" or not sms:
        return zero

    def slower(gemm: np.ndarray, n: int) -> np.ndarray:
        return gemm * (sms / (sms - min(n, sms - 1)) - 1.0)

    fc2 = slower(lt["fc2_gemm_forward"], runtime.userbuffers_fc2_sms) if model.moe is None \
        else zero
    on = np.asarray(r.sp, bool) & (np.asarray(r.tp, float) > 1)
    return np.where(on, slower(lt["proj_gemm_forward"], runtime.userbuffers_proj_sms) + fc2, 0.0)


def _dp_comm(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
             runtime: RuntimeTraits, crit: dict[str, np.ndarray], psi: np.ndarray
             ) -> np.ndarray:
    """Exposed seconds of the data-parallel (ZeRO) collectives per step.

    ZeRO >= 1 runs one collective per FSDP unit (each block and the root); ZeRO-0 one per
    25 MiB gradient bucket (torch DDP's bucket_cap_mb; Megatron's buckets are similar). Per
    step: ZeRO-0 all-reduces gradients; ZeRO-1 reduce-scatters once and all-gathers once;
    ZeRO-2 reduce-scatters every micro-batch; ZeRO-3 also gathers weights in forward and
    backward of every micro-batch. Under a pipeline that defers gradient sync
    (runtimes.PipelineGradSync) ZeRO-2/3 reduce-scatter once. Overlap (runtime.overlap_*):
    reductions hide behind the backward they follow, gathers behind the compute they precede;
    one unit of each is always exposed (the first gather, the last reduction). FSDP2's copies
    around them are not hidden (RuntimeTraits.fsdp2_copies)."""
    gpn = profile.gpus_per_node
    inside = comm.intra_node(r.tp, r.shard, gpn)
    nodes = comm.members_per_node(r.tp, r.shard, gpn)
    g_bytes = psi * r.reduce_bytes
    p_bytes = psi * r.weight_bytes
    calls = np.where(r.zero >= 1, r.layers_max + 1.0,
                     np.maximum(1.0, np.ceil(g_bytes / (memory.DDP_BUCKET_BYTES / 2))))

    def coll(kind: str, nbytes: np.ndarray) -> np.ndarray:
        return calls * comm.collective_time_s(kind, nbytes / calls, r.shard, inside, profile,
                                              per_node=nodes)

    rs, ag, ar = (coll(comm.REDUCE_SCATTER, g_bytes), coll(comm.ALL_GATHER, p_bytes),
                  coll(comm.ALL_REDUCE, g_bytes))
    # HSDP (torchtitan's dp_replicate x dp_shard): each reduce-scatter inside the shard group is
    # followed by an all-reduce of the 1/shard gradient across the replicas, whose ranks sit
    # tp x shard apart (FSDP2's HSDP reduce, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
    rep_stride = r.tp * r.shard
    rs = rs + np.where(r.replicate > 1, calls * comm.collective_time_s(
        comm.ALL_REDUCE, g_bytes / r.shard / calls, r.replicate,
        comm.intra_node(rep_stride, r.replicate, gpn), profile,
        per_node=comm.members_per_node(rep_stride, r.replicate, gpn)), 0.0)
    once = r.unsharded_accumulation | (r.zero <= 1)
    reductions = np.where(r.zero == 0, ar, np.where(once, 1.0, r.m) * rs)
    gathers = np.where(r.zero == 0, 0.0, np.where(r.zero == 3, 2.0 * r.m, 1.0) * ag)
    overlap = profile.efficiency.overlap
    # reductions follow one micro-batch's backward, or every one when they run each time (a
    # pipeline engine's after the last backward: nothing); gathers precede the forward (ZeRO-1/2:
    # once per step) or every forward and backward
    red_overlap = np.where((r.pp > 1) & runtime.pipeline_engine_reduce, 0.0, overlap)
    hide_red = np.where(once, 1.0, r.m) * crit["backward"] * red_overlap
    hide_gat = np.where(r.zero == 3, r.m * (crit["forward"] + crit["backward"]),
                        crit["forward"]) * overlap
    if runtime.overlap_param_gather:
        exposed_red = np.maximum(reductions / calls, reductions - hide_red)
        exposed_gat = np.maximum(np.where(r.zero == 0, 0.0, gathers / calls), gathers - hide_gat)
    else:
        exposed_red, exposed_gat = np.maximum(0.0, reductions - hide_red), gathers
    has_dp = (r.shard > 1) | (r.replicate > 1)
    # FSDP2's copy-out after each gather and copy-in before each reduction, on the compute
    # stream (RuntimeTraits.fsdp2_copies): read and write the 16-bit parameters; read the
    # 16-bit gradients and write them in the reduce dtype
    n_gathers = np.where(r.zero == 3, 2.0 * r.m, 1.0)
    copies = compute.memory_time_s(psi * (n_gathers * 2.0 * r.weight_bytes + np.where(
        once, 1.0, r.m) * (r.weight_bytes + r.reduce_bytes)), profile)
    copies = np.where(runtime.fsdp2_copies & r.fsdp & (r.zero >= 1) & (r.shard > 1), copies,
                      0.0)
    # what overlap hides still slows the compute it runs beside (comm.contention_s)
    hidden = reductions - exposed_red + np.maximum(0.0, gathers - exposed_gat)
    return np.where(has_dp, exposed_red + exposed_gat + comm.contention_s(hidden, profile),
                    0.0) + copies


def time_by_part(
    model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str, eager: bool,
    runtime: RuntimeTraits, parts: dict[str, np.ndarray], psi: np.ndarray,
) -> dict[str, np.ndarray]:
    """time_<part> (seconds per step) and time_step, with t_mb (seconds per micro-batch)."""
    profile = priced_profile(profile, runtime)
    eff, gpn = profile.efficiency, profile.gpus_per_node
    crit = _stages(model, profile, r, precision, eager, runtime, parts)
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
    out["time_pp_comm"] = np.where(r.pp > 1, 2.0 * (m * r.vpp + r.pp - 1.0) * p2p, 0.0)
    # first and last stage sum their copies' (FSDP-sharded) gradients: a tied head's, or the
    # embedding the MTP module's loss stage keeps again (step_memory.mtp_embedding_copy;
    # Megatron-Core finalize_model_grads: `share_embeddings_and_output_weights or
    # mtp_num_layers`); under ZB-V and DualPipe both copies sit on rank 0 and add up locally
    if model.tie_embeddings or (model.mtp_layers > 0 and not runtime.dualpipe):
        head = r.vocab * model.hidden_size / r.tp
        tied = head * r.reduce_bytes / np.where(r.fsdp & (r.zero >= 1),
                                                                 r.shard, 1.0)
        out["time_pp_comm"] += np.where((r.pp > 1) & ~r.v_shape, comm.collective_time_s(
            comm.ALL_REDUCE, tied, np.full_like(r.pp, 2.0),
            comm.intra_node(r.tp * r.cp * r.dp, r.pp, gpn), profile), 0.0)

    # every step all-reduces the loss and the gradient norm over the whole job, and an fp16
    # run its overflow verdict: tiny collectives that nothing hides
    syncs = 3.0 if precision == "fp16" else 2.0
    one = np.ones_like(r.world)
    step_sync = syncs * comm.collective_time_s(
        comm.ALL_REDUCE, np.full_like(r.world, 8.0), r.world, comm.intra_node(one, r.world, gpn),
        profile, per_node=comm.members_per_node(one, r.world, gpn))
    fsdp_host = m * fsdp_unit_host_s(r, runtime, profile)[1]
    # DualPipe: a rank reduces, gathers and steps its two stages (psi is the pair's: memory's
    # mem_psi), in units of both stages' blocks. Each stage's copies sit on two ranks of one
    # replica, so its gradient sums over 2 dp ranks, not dp: a ring moves (2dp - 1)/(2dp) of
    # the bytes instead of (dp - 1)/dp (0.4% more at dp 128), left unpriced
    paired = runtime.dualpipe & (r.pp > 1)
    held = np.where(paired, 2.0 * r.layers_max, r.layers_max)
    out["time_dp_comm"] = _dp_comm(model, profile, replace(r, layers_max=held), precision,
                                   runtime, crit, psi) + step_sync + fsdp_host
    if model.moe is not None:  # routed experts: their own states and expert-DP group
        psi_e = moe.expert_psi(model, r, r.layers_max)
        if runtime.dualpipe:  # the pair's: first + last (the loss stage's MTP block), 2 middles
            mtp_e = mtp.params_per_rank(model, r.tp, r.ep, r.etp)[1]
            psi_e = np.where(paired, np.maximum(
                moe.expert_psi(model, r, r.layers_first + r.layers_last) + mtp_e,
                2.0 * psi_e), psi_e)
        out["time_dp_comm"] += moe.expert_dp_comm_s(
            model, profile, r, r.reduce_bytes, psi_e,
            crit["backward"] * eff.overlap)
        psi = psi + psi_e * np.where(r.zero >= 1, r.shard / r.expert_shard, 1.0)

    shard_params = psi / np.where(r.zero >= 1, r.shard, 1.0)
    gpus_per_host = np.minimum(r.world, gpn)
    # FSDP2's parameter offload steps the optimizer on the host as well
    host_step = r.offload_optimizer | (r.offload_params & runtime.fsdp2_offload)
    out["time_offload"] = (
        np.where(host_step, offload.optimizer_offload_time_s(
            shard_params, gpus_per_host, r.weight_bytes,
            offload.HOST_GRAD_BYTES, profile, crit["backward"] * eff.overlap), 0.0)
        + np.where(r.offload_params, offload.param_offload_time_s(
            psi / r.shard, m, r.weight_bytes, profile, m * crit["t_mb"] * eff.overlap), 0.0))
    tensors = held * params.tensors_per_layer(model) + params.end_tensors(model)
    out["time_optimizer"] = np.where(
        host_step, 0.0,
        compute.memory_time_s(
            shard_params * (ADAM_BYTES_PER_PARAM + runtime.optimizer_extra_bytes)
            # the gradient buffer: whole under DDP and the distributed optimizer (ZeRO 0-1),
            # a shard under Megatron-FSDP (ZeRO-2/3)
            + np.where(runtime.zeroes_grad_buffer,
                       np.where(r.zero >= 2, shard_params, psi) * r.grad_bytes, 0.0), profile)
    ) + tensors * (eff.optimizer_overhead_s + np.where(
        r.fsdp | (r.tp > 1), eff.dtensor_optimizer_overhead_s, 0.0))
    slots = profile.host.compute_slots
    if slots:  # more ranks than cores on a node time-share them (CPU runs)
        share = np.maximum(1.0, np.minimum(r.world, gpn) / slots)
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
