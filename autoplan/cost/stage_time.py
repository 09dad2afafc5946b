"""Seconds per micro-batch of the pipeline's stages: one block as its runtime runs it (compute,
recompute, tensor-, context- and expert-parallel communication), a stage of blocks with its ends
(embedding, head and loss, multi-token prediction), and the slowest stage a step waits on.

step_time.py turns the critical stage into seconds per step; compute.py, comm.py, moe.py and
mtp.py hold the formulas and their sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.cost import activations, comm, compute, elementwise, moe, moe_dispatch, mtp, te_ring
from autoplan.cost.recompute_time import deepseek_v3_recompute_s, module_recompute_s
from autoplan.cost.rows import Rows, recomputed_layers
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


def gemm_peak(profile: ClusterProfile, precision: str, runtime: RuntimeTraits) -> float:
    """The peak a block's GEMMs run at: the profile's for the plan's precision, an fp8 run's
    scaled by the runtime's fp8 kernels (RuntimeTraits.fp8_gemm_efficiency)."""
    scale = runtime.fp8_gemm_efficiency if precision == "fp8" else 1.0
    return profile.device.peak(precision) * scale


def sixteen_bit_peak(profile: ClusterProfile, precision: str) -> float:
    """The peak attention and the output layer run at: an fp8 run's 16-bit peak (MFU takes the
    plan precision's own peak, estimate.estimate_table)."""
    return profile.device.peak("bf16" if precision == "fp8" else precision)


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


USERBUFFERS_BULK_SHARE = 0.5
"""Transformer Engine's userbuffers bulk overlaps (qkv_dgrad, qkv_wgrad, fc1_dgrad,
fc1_wgrad: 4 equal collectives, the 2 re-gathers of the norm outputs among them) as a share of
the 8 a block's sequence-parallel "layer" total prices (RuntimeTraits.tp_exposed_share): the
time their SMs run beside the GEMMs (comm.contention_s)."""


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


@dataclass(frozen=True)
class TensorParallelCosts:
    """A block's tensor-parallel collectives per micro-batch, and what overlap can hide."""

    collectives: dict[str, np.ndarray]
    """comm.tensor_parallel_time_s: per layer, per recompute kind, embedding, head, norm_grad."""
    recompute: np.ndarray
    """The collectives a recomputed layer runs again."""
    exposed: np.ndarray
    """Share of a layer's collectives the runtime's overlap leaves exposed."""
    recompute_exposed: np.ndarray
    """Likewise for the recompute's collectives."""
    hideable: np.ndarray
    """GEMM seconds a layer's collectives can hide behind."""
    by_nccl: np.ndarray
    """The hidden collectives run on NCCL's SMs (False: userbuffers' pipelined overlap)."""
    userbuffers_bulk: np.ndarray
    """Share of a layer's collectives userbuffers runs as bulk overlaps on SMs of their own."""


@dataclass(frozen=True)
class BlockCosts:
    """Seconds per micro-batch one block costs its stage, by part: what `stage_s` scales by the
    stage's layer count, and by its recomputed layers for the recompute terms."""

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
    tp: TensorParallelCosts
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
    margin = userbuffers_margin_s(model, profile, runtime, r, lt)
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


def tensor_parallel_costs(model: ModelSpec, profile: ClusterProfile, r: Rows,
                          runtime: RuntimeTraits, lt: dict[str, np.ndarray],
                          parts: dict[str, np.ndarray]) -> TensorParallelCosts:
    """A block's tensor-parallel collectives, those a recomputed layer runs again, and how much
    of each the runtime's overlap can hide."""
    tokens = model.seq_len / r.cp * r.b
    gpn = profile.gpus_per_node
    tp_nodes = comm.members_per_node(np.ones_like(r.tp), r.tp, gpn)
    tpc = comm.tensor_parallel_time_s(model, r.weight_bytes * tokens * model.hidden_size,
                                      4.0 * tokens, r.tp, r.sp,
                                      comm.intra_node(np.ones_like(r.tp), r.tp, gpn), profile,
                                      per_node=tp_nodes)
    # Megatron's selective re-runs only the attention core on the Q, K, V it kept: no
    # collective again; the runtimes that re-run the norms re-gather their SP outputs
    selective_tp = 0.0 * tpc["recompute_selective"] if runtime.selective.value == \
        "attention-core" else tpc["recompute_selective"]
    full_tp = tpc["recompute_reentrant" if runtime.reentrant_recompute else "recompute_full"]
    by_module = r.rc_modules > 0
    tp_rec = np.where(r.recompute == RC_FULL, full_tp,
                      np.where(r.recompute == RC_SELECTIVE, np.where(
                          # Megatron re-runs the MLP under its reentrant checkpoint: fc1's
                          # gather and fc2's reduction, one MLP forward's (a quarter of the
                          # block's)
                          by_module, np.where((r.rc_modules & activations.MLP) > 0,
                                              parts.get("dense_share", 1.0)
                                              * tpc["layer"] / 4.0, 0.0),
                          selective_tp), 0.0))
    # NCCL's collectives slow the compute they hide behind (comm.contention_s); Transformer
    # Engine's userbuffers overlap runs its own kernels (ring exchanges on the copy engines)
    tp_by_nccl = np.where(runtime.tp_comm_overlap_method == "userbuffers",
                          runtime.tp_async_dgrad(r.tp, r.sp), True)
    return TensorParallelCosts(
        collectives=tpc, recompute=tp_rec,
        # what the runtime's overlap leaves exposed, never hiding more than the block's GEMMs
        # take (forward, plus backward's two GEMMs per forward one; the recomputed forward's
        # likewise)
        exposed=runtime.tp_exposed_share(r.tp, r.sp),
        recompute_exposed=runtime.tp_recompute_exposed_share(r.tp, r.sp),
        # async dgrad hides behind the column-parallel GEMMs' weight gradients only
        hideable=np.where(runtime.tp_async_dgrad(r.tp, r.sp), lt["column_gemm_forward"],
                          3.0 * lt["gemm_forward"]),
        by_nccl=tp_by_nccl,
        # userbuffers' bulk overlaps (4 of a block's 10 collectives, the QKV and fc1 backward)
        # run on SMs of their own beside the GEMM, as NCCL does; its ring exchanges copy on the
        # copy engines and its pipelined reduce-scatters keep their SMs apart
        # (userbuffers_margin_s)
        userbuffers_bulk=np.where(tp_by_nccl, 0.0, USERBUFFERS_BULK_SHARE))


def context_parallel_costs(model: ModelSpec, profile: ClusterProfile, r: Rows,
                           runtime: RuntimeTraits, lt: dict[str, np.ndarray], precision: str
                           ) -> tuple[np.ndarray, np.ndarray]:
    """A block's exposed context-parallel exchanges, and those a recomputed layer runs again
    (none where its recompute.modules keep the attention core), as the runtime exchanges K/V
    (RuntimeTraits.cp_exchange)."""
    gpn = profile.gpus_per_node
    cp_inside = comm.intra_node(r.tp, r.cp, gpn)
    cp_nodes = comm.members_per_node(r.tp, r.cp, gpn)
    keeps_core = (r.rc_modules > 0) & ((r.rc_modules & activations.CORE_ATTN) == 0)
    if runtime.cp_exchange == "torch-ring":
        width = model.q_width if runtime.kv_repeated else model.kv_heads * model.head_width
        kv_bytes = 2.0 * r.weight_bytes * model.seq_len * r.b * width / r.tp
        ring = comm.torch_ring_time_s(kv_bytes, r.cp, lt["core_forward"] / r.cp,
                                      lt["core_backward"] / r.cp, cp_inside, profile,
                                      per_node=cp_nodes)
        # a recomputed attention core runs the forward ring again
        return ring["forward"] + ring["backward"], np.where(keeps_core, 0.0, ring["forward"])
    if runtime.cp_exchange == "te-p2p":
        ring = te_ring.ring_time_s(model, profile, r, precision, runtime, cp_inside)
        return ring["forward"] + ring["backward"], np.where(keeps_core, 0.0, ring["forward"])
    cp_layer = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                            profile, per_node=cp_nodes)
    cp_rec = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                          profile, recompute_gathers=1.0,
                                          per_node=cp_nodes) - cp_layer
    return cp_layer, np.where(keeps_core, 0.0, cp_rec)


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
    cp_layer, cp_rec = context_parallel_costs(model, profile, r, runtime, lt, precision)
    return BlockCosts(block_s=lt, wgrad=lt["gemm_forward"] + delta, recompute=rec_extra, a2a=a2a,
                      a2a_recompute=a2a_rec,
                      tp=tensor_parallel_costs(model, profile, r, runtime, lt, parts),
                      cp=cp_layer, cp_recompute=cp_rec)


def stage_s(c: BlockCosts, r: Rows, profile: ClusterProfile, runtime: RuntimeTraits,
            layers: np.ndarray, extra: np.ndarray, tp_ends: np.ndarray,
            extra_a2a: np.ndarray | float = 0.0, embed: np.ndarray | float = 0.0
            ) -> dict[str, np.ndarray]:
    """Seconds per micro-batch of a stage of `layers` blocks, by part (compute, recompute, tp,
    cp, ep), with its forward, backward and weight-gradient compute for the schedules; `extra`
    is the compute its ends add (head, loss, MTP), `tp_ends` their collectives, `extra_a2a`
    their all-to-alls, `embed` the embedding gradient."""
    lt, tp, tp_layer = c.block_s, c.tp, c.tp.collectives["layer"]
    n = recomputed_layers(layers, r)
    layer_hidden = layers * np.minimum((1.0 - tp.exposed) * tp_layer, tp.hideable)
    tp_hidden = layer_hidden + n * np.minimum((1.0 - tp.recompute_exposed) * tp.recompute,
                                              lt["gemm_forward"])
    contended = np.where(tp.by_nccl, tp_hidden,
                         np.minimum(tp.userbuffers_bulk * layers * tp_layer, layer_hidden))
    # all-to-alls hidden behind another micro-batch's compute as far as the runtime overlaps
    # them (RuntimeTraits.ep_comm_overlap), never more than that compute
    ep_hidden = runtime.ep_comm_overlap * np.minimum(
        layers * c.a2a + n * c.a2a_recompute + extra_a2a,
        layers * (lt["forward"] + lt["backward"]))
    # SMs a runtime reserves for communication are priced for the whole step (priced_profile)
    reserved = runtime.comm_reserved_sms > 0
    return {
        "compute": layers * (lt["forward"] + lt["backward"] + lt["dtensor"]) + extra + embed,
        "recompute": n * c.recompute,
        "tp": layers * tp_layer + n * tp.recompute + tp_ends - tp_hidden
              + comm.contention_s(contended, profile),
        "cp": layers * c.cp + n * c.cp_recompute,
        "ep": layers * c.a2a + n * c.a2a_recompute + extra_a2a - ep_hidden
              + (0.0 if reserved else comm.contention_s(ep_hidden, profile)),
        "forward": layers * lt["forward"],
        "backward": layers * lt["backward"],
        # the head's and MTP's GEMMs: a third of their forward + backward is weight gradient
        "wgrad": layers * c.wgrad + extra / 3.0,
        "layers": layers + 0.0 * extra,
    }


def loss_on_first(r: Rows) -> np.ndarray:
    """1.0 where the head and its loss sit on the first stage (no pipeline, or ZB-V/DualPipe's
    V shape), else 0.0: they sit on the last."""
    return np.where((r.pp == 1) | r.v_shape, 1.0, 0.0)


def stages_s(c: BlockCosts, model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
             runtime: RuntimeTraits) -> list[dict[str, np.ndarray]]:
    """stage_s of the first, the largest and the last pipeline stage, the ends with the
    embedding, the head and its loss, and multi-token prediction where they sit."""
    # the output layer stays 16-bit in fp8 runs
    logit_t = compute.logits_times_s(model, profile, sixteen_bit_peak(profile, precision), r.b,
                                     r.tp, r.cp, r.vocab, runtime.loss_bytes(precision))
    embed_t = embedding_grad_s(model, profile, runtime, r)
    # multi-token prediction (cost/mtp.py) on the stage with the loss: one more block each
    # depth, priced as the stage's blocks, plus eh_proj, the MoE kind's excess and a second
    # head with its cross-entropy (fwd + bwd: 3x the forward extras)
    d_mtp = float(model.mtp_layers)
    mtp_x = 3.0 * mtp.extra_forward_s(model, profile, gemm_peak(profile, precision, runtime), r) \
        + d_mtp * logit_t
    mtp_a2a = mtp.extra_all_to_all_s(model, c.a2a)
    head_first = loss_on_first(r)
    head_last = 1.0 - head_first

    head_tp = (1.0 + d_mtp) * c.tp.collectives["head"]

    def stage(layers: np.ndarray, head: np.ndarray, tp_ends: np.ndarray,
              embed: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
        """An end stage: its blocks, and the head, loss and MTP where `head` is 1."""
        return stage_s(c, r, profile, runtime, layers + d_mtp * head, head * (logit_t + mtp_x),
                       tp_ends + head * head_tp, head * mtp_a2a, embed)

    return [stage(r.layers_first, head_first, c.tp.collectives["embedding"], embed_t),
            stage_s(c, r, profile, runtime, r.layers_max, 0.0 * r.layers_max,
                    0.0 * r.layers_max),
            stage(r.layers_last, head_last, 0.0 * r.layers_max)]


def critical_stage_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                     eager: bool, runtime: RuntimeTraits, parts: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of the slowest of the first, largest and last stage, by part,
    with t_mb (its total), t_fill (what each other rank adds to the pipeline's fill),
    holds_head and norm_grad (sequence parallelism's partial norm gradients per tensor)."""
    c = block_costs(model, profile, r, precision, eager, runtime, parts)
    stages = stages_s(c, model, profile, r, precision, runtime)
    head_first = loss_on_first(r)
    if runtime.dualpipe:  # rank 0 holds the first and the last stage (RuntimeTraits.dualpipe);
        # without a pipeline the one stage is the whole model, head included
        piped = r.pp > 1
        ends = {k: np.where(piped, (stages[0][k] + stages[2][k]) / 2.0, stages[0][k])
                for k in stages[0]}
        # its once-per-step sums (sequence parallelism's norm gradients) cover both stages'
        # blocks, not their mean
        ends["layers"] = np.where(piped, stages[0]["layers"] + stages[2]["layers"],
                                  stages[0]["layers"])
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
    if runtime.dualpipe:  # rank 0's last stage holds the head (and the final norm)
        crit["holds_head"] = np.where((r.pp > 1) & (slowest != 1), 1.0, crit["holds_head"])
    crit["norm_grad"] = c.tp.collectives["norm_grad"]
    return crit
