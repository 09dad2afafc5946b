"""Peak memory per GPU by part, at the pipeline stages that can hold the most.

Stage 0 holds the embedding and the most micro-batches in flight; the last stage the output
layer and its fp32 logits; an uneven split is bounded by its largest stage. The worst stage's
parts are reported (memory.py has the formulas and their sources).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost import (
    activations,
    latent_attention,
    memory,
    moe,
    moe_dispatch,
    mtp,
    params,
    pipeline,
    te_ring,
)
from autoplan.cost.rows import Rows, recomputed_layers, uniform_groups
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.plan_table import GPIPE, RC_NONE

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "allocator", "reserved")


FP8_SAVED_INPUTS = ("gemm_in", "gemm_in_routed", "attn_out", "mlp_mid", "mlp_mid_dense",
                    "mlp_mid_routed")
"""Activation parts that are GEMM inputs, which an fp8 run saves in fp8 (half the bytes)."""


def activation_parts(model: ModelSpec, r: Rows, eager: bool, runtime: RuntimeTraits,
                     precision: str = "bf16") -> dict[str, np.ndarray]:
    parts = activations.activation_elements_per_layer(
        model, r.b, r.tp, r.sp, r.cp, eager, fused_norm=runtime.fused_norm,
        fused_swiglu=runtime.fused_swiglu, kv_repeated=runtime.kv_repeated,
        attention_dropout=runtime.attention_dropout)
    if runtime.sp_gathered_gemm_inputs:  # the column-parallel GEMMs keep gathered inputs
        parts["gemm_in"] = parts["gemm_in"] * np.where(np.asarray(r.sp), r.tp, 1.0)
    parts = moe.routed_activation_parts(model, r, parts)  # unchanged for a dense model
    # what a zero-bubble step I keeps for its W: 16-bit gradients, also in an fp8 run
    parts["wgrad_inputs"] = memory.weight_grad_input_bytes(parts)
    fp8 = precision == "fp8" and runtime.fp8_activations
    if fp8:
        # routed experts a runtime runs 16-bit (RuntimeTraits.fp8_experts) save 16-bit inputs:
        # their share of gemm_in and mlp_mid stays whole
        whole = {} if runtime.fp8_experts else {"gemm_in": "gemm_in_routed",
                                                 "mlp_mid": "mlp_mid_routed"}
        kept = {k: parts.get(whole[k], 0.0) if k in whole else 0.0 for k in FP8_SAVED_INPUTS}
        parts = {**parts, **{k: (parts[k] - kept[k]) / 2.0 + kept[k] for k in FP8_SAVED_INPUTS
                             if k in parts and k not in whole.values()}}
    parts["fp8_scale"] = np.asarray(0.5 if fp8 else 1.0)
    parts["mla_latent"] = latent_attention.mla_latent_bytes(model, r)
    # already at the run's precision (activations.activation_bytes_per_layer adds it as it is)
    parts["moe_extra"] = (moe.eager_moe_bytes(model, r, precision) if runtime.moe_eager_tensors
                          else 0.0 * parts["qkv"])
    parts["attn_upcast"] = 0.0 * parts["qkv"]
    if not eager and precision in ("bf16", "fp16") and runtime.attention_precision(
            precision) == "fp32":
        # a 16-bit plan's core in fp32 (autoplan-cpu): the kernel keeps fp32 Q, K, V (twice
        # the bytes) and its fp32 output beside the 16-bit cast the output projection keeps
        # (three times): measured with saved-tensor hooks, tests/unit/runtime
        parts["attn_upcast"] = parts["qkv"] + 2.0 * parts["attn_out"]
    return parts


def mtp_embedding_copy(model: ModelSpec, r: Rows, runtime: RuntimeTraits) -> np.ndarray:
    """Parameters per GPU of the embedding copy a loss stage apart from stage 0 builds for
    the MTP module's input (Megatron-Core gpt_model.py: `if self.pre_process or
    self.mtp_process` builds the embedding; finalize_model_grads all-reduces its gradient with
    stage 0's, as for tied embeddings): vocab x h / tp when mtp_layers > 0 and the loss sits on
    another rank. Under ZB-V and DualPipe the two stages share rank 0 and with it the one
    embedding (DeepSeek-V3 report §3.2.3: sharing it physically needs that pairing)."""
    apart = (r.pp > 1) & ~r.v_shape & (not runtime.dualpipe) & (model.mtp_layers > 0)
    return np.where(apart, r.vocab * model.hidden_size / r.tp, 0.0)


def _stage_states(model: ModelSpec, r: Rows, precision: str, runtime: RuntimeTraits
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray],
                             np.ndarray, np.ndarray]:
    """Model states of the first, the last and a middle stage (layers_max blocks and neither
    the embedding nor the head: an uneven split's heaviest rank), the largest parameter count
    of one stage, and of a DualPipe rank's two stages (first + last, or two middles)."""
    psi_first, psi_last = params.params_per_rank(model, r.tp, r.pp, r.layers_first,
                                                 r.layers_last)
    psi_mid = (params.params_per_rank(model, r.tp, r.pp, r.layers_max, r.layers_max)[0]
               - params.params_per_rank(model, r.tp, r.pp, 0.0 * r.layers_max,
                                       0.0 * r.layers_max)[0])
    # ZB-V puts the last stage on rank 0 beside the first (Qi et al. 2024): the head lives there
    # (a tied head is the embedding's own parameter there, runtime/tied_embeddings.py `retie`)
    head = r.vocab * model.hidden_size / r.tp
    psi_first = psi_first + np.where(r.v_shape & (not model.tie_embeddings), head, 0.0)
    psi_last = psi_last - np.where(r.v_shape, head, 0.0)
    # multi-token prediction: its block, projection and norms on the stage with the loss
    mtp_rest, mtp_experts = mtp.params_per_rank(model, r.tp, r.ep, r.etp)
    loss_first = (r.pp == 1) | r.v_shape
    psi_first = psi_first + np.where(loss_first, mtp_rest, 0.0)
    psi_last = psi_last + np.where(loss_first, 0.0, mtp_rest + mtp_embedding_copy(model, r,
                                                                                  runtime))

    def states(psi: np.ndarray, shard: np.ndarray | None = None) -> dict[str, np.ndarray]:
        out = memory.model_state_bytes(
            psi, r.zero, r.shard if shard is None else shard, precision, r.offload_optimizer, r.offload_params,
            grad_bytes=r.grad_bytes,
            unsharded_accumulation=r.unsharded_accumulation,
            fp32_sharded_params=runtime.fp32_sharded_params,
            fsdp2_offload=runtime.fsdp2_offload, sharded_grads=r.sharded_grads)
        if precision == "fp8":  # the fp8 weight copies (and transposes) a runtime caches
            out["params"] = out["params"] + psi * runtime.fp8_weight_cache_bytes
        return out

    first, last, mid = states(psi_first), states(psi_last), states(psi_mid)
    if model.moe is not None:  # routed experts: split by ep x etp, ZeRO over the expert-DP group
        for st, layers, mtp_e in ((first, r.layers_first, np.where(loss_first, mtp_experts, 0.0)),
                                  (last, r.layers_last, np.where(loss_first, 0.0, mtp_experts)),
                                  (mid, r.layers_max, 0.0 * mtp_experts)):
            experts = states(moe.expert_psi(model, r, layers) + mtp_e, r.expert_shard)
            for k in st:
                st[k] = st[k] + experts[k]
    return (first, last, mid, np.maximum(np.maximum(psi_first, psi_last), psi_mid),
            np.maximum(psi_first + psi_last, 2.0 * psi_mid))


def held_expert_psi(model: ModelSpec, r: Rows, runtime: RuntimeTraits) -> np.ndarray:
    """Routed expert parameters the heaviest rank holds and steps: a stage of layers_max
    blocks, or DualPipe's pair (first + last with the loss stage's MTP block, or two middles)."""
    psi_e = moe.expert_psi(model, r, r.layers_max)
    if not runtime.dualpipe:
        return psi_e
    mtp_e = mtp.params_per_rank(model, r.tp, r.ep, r.etp)[1]
    return np.where(r.pp > 1, np.maximum(
        moe.expert_psi(model, r, r.layers_first + r.layers_last) + mtp_e, 2.0 * psi_e), psi_e)


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes per GPU of the first, the last and a middle (the largest) stage, with
    what DualPipe's pairing of stages re-adds (_dualpipe_ranks)."""

    first: np.ndarray
    last: np.ndarray
    mid: np.ndarray
    of_layers: Callable[[np.ndarray], np.ndarray]
    """Bytes one micro-batch keeps in n blocks under the row's recompute."""
    working: np.ndarray
    """The backward's working set beside what is kept (memory.backward_wavefront_bytes)."""
    logits: np.ndarray
    """The head's logits and loss buffers (saved and transient)."""
    ends: tuple[np.ndarray, np.ndarray]
    """The first and the last stage's bytes per micro-batch in flight."""


def stage_activation_bytes(model: ModelSpec, r: Rows, precision: str, eager: bool,
                           runtime: RuntimeTraits, parts: dict[str, np.ndarray]
                           ) -> StageActivations:
    """What each stage keeps for the micro-batches it holds in flight, plus the backward's
    working set and, where the head sits, its logits."""
    a_none = activations.activation_bytes_per_layer(parts, np.zeros_like(r.recompute), precision)
    a_pol = activations.activation_bytes_per_layer(parts, r.recompute, precision,
                                                   runtime.selective.value, r.rc_modules)

    def act_layers(layers: np.ndarray) -> np.ndarray:
        n = recomputed_layers(layers, r)
        # uniform: one kept input per group of recompute_layers layers (Megatron's method)
        return np.where(r.rc_uniform, uniform_groups(layers, r) * a_pol,
                        n * a_pol + (layers - n) * a_none)

    working = _working_set(r, precision, eager, runtime, parts, a_none, a_pol)
    sp_div = np.where(r.sp, r.tp, 1.0)
    embed_act = 3.0 * model.seq_len / r.cp * r.b * model.hidden_size / sp_div * r.act_scale
    d_mtp = float(model.mtp_layers)
    single = r.pp == 1
    loss_first = single | r.v_shape
    mtp_first, mtp_last = (np.where(at, d_mtp, 0.0) for at in (loss_first, ~loss_first))
    mtp_act = mtp.extra_activation_bytes(model, r) * r.act_scale
    end_first = (act_layers(r.layers_first + mtp_first) + embed_act
                 + np.where(loss_first, mtp_act, 0.0))
    end_last = act_layers(r.layers_last + mtp_last) + np.where(loss_first, 0.0, mtp_act)
    # saved activations per rank (pipeline.in_flight_*), and under zero-bubble the gradients
    # each deferred weight-gradient step keeps (pipeline.deferred_weight_grads)
    held = [f(r.schedule, r.pp, r.vpp, r.m) for f in (
        pipeline.in_flight_microbatches, pipeline.in_flight_middle_rank,
        pipeline.in_flight_last_rank)]
    zb = pipeline.deferred_weight_grads(r.schedule, r.pp, r.vpp, r.m)
    wgrad = parts["wgrad_inputs"] * r.act_scale  # per block

    def kept(n: np.ndarray, per_set: np.ndarray, layers: np.ndarray, pending: np.ndarray
             ) -> np.ndarray:
        """n layer sets kept, `pending` of them with their W's gradients; ZB-V's cool-down
        holds c of each (a bound on a middle rank too)."""
        c = zb.v_cooldown
        return np.maximum(n * per_set + pending * layers * wgrad, c * (per_set + layers * wgrad))

    logits = _loss_stage_bytes(model, r, runtime, working, d_mtp, zb.head)
    # after a micro-batch's backward the trainer's metric passes (train_metric_passes) run over
    # its logits, its own activations freed, beside the micro-batches still in flight
    metric = runtime.metric_live_bytes(precision) * memory.logit_elements(
        model, r.b, r.tp, r.vocab, r.cp)
    none = np.zeros_like(r.pp, dtype=float)

    def after_backward(n: np.ndarray, per_set: np.ndarray, layers: np.ndarray) -> np.ndarray:
        return kept(np.maximum(n - 1.0, 0.0), per_set, layers, none) + metric

    act_first = (kept(held[0], end_first, r.layers_first + mtp_first, zb.first) + working
                 + np.where(loss_first, logits, 0))
    act_first = np.where(loss_first, np.maximum(
        act_first, after_backward(held[0], end_first, r.layers_first + mtp_first)), act_first)
    act_last = (kept(held[2], end_last, r.layers_last + mtp_last, zb.last) + working
                + np.where(r.v_shape, 0.0, logits))
    act_last = np.where(r.v_shape, act_last, np.maximum(
        act_last, after_backward(held[2], end_last, r.layers_last + mtp_last)))
    act_last = np.where(single, act_first, act_last)
    act_mid = np.where(single, act_first, kept(held[1], act_layers(r.layers_max), r.layers_max,
                                               zb.mid) + working)
    return StageActivations(first=act_first, last=act_last, mid=act_mid, of_layers=act_layers,
                            working=working, logits=logits, ends=(end_first, end_last))


def _working_set(r: Rows, precision: str, eager: bool, runtime: RuntimeTraits,
                 parts: dict[str, np.ndarray], a_none: np.ndarray, a_pol: np.ndarray
                 ) -> np.ndarray:
    """Bytes one block holds beside what is kept while it runs: its backward's gradients in
    flight (memory.backward_wavefront_bytes), or PyTorch ring attention's gathered K/V and
    merges in its forward (memory.torch_ring_attention_bytes; Transformer Engine's ring:
    te_ring.attention_bytes), whichever is wider, plus what a
    recomputed block brings back (all of it under full recompute, the re-run part
    selectively; a uniform group's backward re-makes all its layers at once)."""
    ring_fwd, ring_bwd = memory.torch_ring_attention_bytes(parts, r.cp, precision)
    if runtime.cp_exchange == "te-p2p":  # Transformer Engine's ring: its buffers instead
        ring_fwd, ring_bwd = te_ring.attention_bytes(parts, r.cp, precision)
    elif runtime.cp_exchange != "torch-ring":
        ring_fwd, ring_bwd = 0.0 * ring_fwd, 0.0 * ring_bwd
    widest = np.maximum(memory.backward_wavefront_bytes(parts, eager, precision, ring_bwd),
                        ring_fwd)
    group = np.where(r.rc_uniform, np.maximum(r.recompute_layers, 1), 1.0)
    return widest + np.where(r.recompute != RC_NONE, group * (a_none - a_pol), 0.0)


def _loss_stage_bytes(model: ModelSpec, r: Rows, runtime: RuntimeTraits, working: np.ndarray,
                      d_mtp: float, pending: np.ndarray) -> np.ndarray:
    """What the stage with the loss holds beyond its blocks' kept activations and `working`:
    the larger of the loss's own peak (memory.logits_bytes: the saved softmax of every
    micro-batch in flight, all of them under GPipe, plus the transient of the one at the
    loss) and the blocks' backward working set beside the softmax the other micro-batches
    keep; the two are not alive together (the head's backward ends before the last block's
    starts). MTP's heads keep their saved softmax beside the main head's, and their transient
    comes one loss at a time. Under zero-bubble, plus the 16-bit logit gradients held for
    deferred weight-gradient steps (`pending` micro-batches, pipeline.DeferredWeightGrads;
    measured: 2 bytes per logit between I and W on the runtime's head and loss)."""
    heads = 1.0 + d_mtp
    n = np.where((r.schedule == GPIPE) & (r.pp > 1), r.m, 1.0)
    elements = memory.logit_elements(model, r.b, r.tp, r.vocab, r.cp)
    saved, transient = runtime.logit_bytes_saved, runtime.logit_bytes_transient
    loss = memory.logits_bytes(model, r.b, r.tp, r.vocab, r.cp, heads * n, saved, transient)
    others = saved * heads * (n - 1.0) * elements
    grads = 2.0 * r.act_scale * heads * elements
    return np.maximum(loss - working + np.maximum(pending - 1.0, 0.0) * grads,
                      others + pending * grads)


def memory_by_part(
    model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str, eager: bool,
    runtime: RuntimeTraits, parts: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """mem_<part>, mem_total and mem_host (bytes per GPU), mem_psi (parameters of the larger
    stage) and fits: the parts of the stage that needs the most."""
    st_first, st_last, st_mid, psi, psi_pair = _stage_states(model, r, precision, runtime)
    acts = stage_activation_bytes(model, r, precision, eager, runtime, parts)
    states = (st_first, st_mid, st_last)
    act = (acts.first, acts.mid, acts.last)
    if runtime.dualpipe:  # rank 0 holds the first and last stages, a middle rank two middles
        # a rank holds two stages' parameters: it reduces and steps them all
        psi = np.where(r.pp > 1, psi_pair, psi)
        first, last, mid, a_first, a_last, a_mid = _dualpipe_ranks(
            r, (st_first, st_last, st_mid), acts)
        states, act = (first, mid, last), (a_first, a_mid, a_last)
    out = _worst_stage_parts(profile, states, act, _buffers(model, r, runtime))
    out["mem_psi"] = psi
    host = memory.host_state_bytes(psi, r.shard, precision, r.offload_optimizer,
                                   r.offload_params, runtime.fsdp2_offload)
    if model.moe is not None:  # the routed experts' offloaded states, over their own group
        host = host + memory.host_state_bytes(held_expert_psi(model, r, runtime),
                                              r.expert_shard, precision, r.offload_optimizer,
                                              r.offload_params, runtime.fsdp2_offload)
    out["mem_host"] = host
    out["fits"] = (out["mem_total"] <= profile.device.memory_bytes) & (
        node_host_bytes(profile, out["mem_total"], host, r.world) <= profile.host.memory_bytes)
    return out


def node_host_bytes(profile: ClusterProfile, mem_total: np.ndarray | float,
                    mem_host: np.ndarray | float, num_gpus: np.ndarray | float) -> np.ndarray:
    """Host memory the ranks of one node need together: their offloaded states, and on a CPU
    profile, whose ranks are host processes sharing it, everything they hold (the check
    `autoplan train` makes before it starts CPU ranks: runtime/launch.host_preflight)."""
    ranks = np.minimum(np.asarray(num_gpus, float), profile.gpus_per_node)
    own = np.asarray(mem_host, float) + (np.asarray(mem_total, float) if profile.is_cpu else 0.0)
    return own * ranks


def _worst_stage_parts(profile: ClusterProfile, states: tuple[dict[str, np.ndarray], ...],
                       acts: tuple[np.ndarray, ...], buffers: np.ndarray
                       ) -> dict[str, np.ndarray]:
    """mem_<part> and mem_total of the stage (first, middle, last; ties to the earlier) whose
    states, activations, buffers, allocator slack and reserve add up to the most."""
    reserved = profile.device.reserved_bytes

    def allocated(st: dict[str, np.ndarray], act: np.ndarray) -> np.ndarray:
        return st["params"] + st["grads"] + st["optimizer"] + act + buffers

    def total(st: dict[str, np.ndarray], act: np.ndarray) -> np.ndarray:
        return allocated(st, act) * (1.0 + memory.FRAGMENTATION) + reserved

    totals = [total(st, a) for st, a in zip(states, acts, strict=True)]
    worst = np.argmax(np.stack(totals), axis=0)

    def pick(values: list[np.ndarray]) -> np.ndarray:
        return np.choose(worst, [v + 0.0 * worst for v in values])

    act = pick(list(acts))
    held = pick([allocated(st, a) for st, a in zip(states, acts, strict=True)])
    return {
        "mem_params": pick([st["params"] for st in states]),
        "mem_grads": pick([st["grads"] for st in states]),
        "mem_optimizer": pick([st["optimizer"] for st in states]),
        "mem_activations": act,
        "mem_buffers": buffers + 0.0 * act,
        "mem_allocator": memory.FRAGMENTATION * held,
        "mem_reserved": np.full_like(act, float(reserved)),
        "mem_total": np.max(np.stack(totals), axis=0),
    }


def _dualpipe_ranks(r: Rows, states: tuple[dict[str, np.ndarray], ...],
                    acts: StageActivations) -> tuple[Any, ...]:
    """States and activations of DualPipe's ranks (runtimes.RuntimeTraits.dualpipe; DeepSeek-V3
    report Table 2): each rank holds two stages' parameters (rank 0 the first and the last, a
    middle rank two middle stages) and pp + 1 micro-batches of its stages' activations, as
    pipeline.dualpipe_in_flight counts them (rank 0: pp of the first stage, one of the last).
    With pp = 2 both ranks are end ranks (no middle one); without a pipeline (pp 1) the one
    stage as it is. Returns (first, last, middle) states, then their activations."""
    first, last, mid = states
    piped, middle = r.pp > 1, r.pp > 2
    n_first, n_last, n_mid = pipeline.dualpipe_in_flight(r.pp)
    pair = {k: np.where(piped, first[k] + last[k], first[k]) for k in first}
    act_pair = np.where(piped, n_first * acts.ends[0] + n_last * acts.ends[1] + acts.working
                        + acts.logits, acts.first)
    twice = {k: np.where(middle, 2.0 * mid[k], pair[k]) for k in mid}
    act_two = np.where(middle, n_mid * acts.of_layers(r.layers_max) + acts.working, act_pair)
    return pair, pair, twice, act_pair, act_pair, act_two


def _buffers(model: ModelSpec, r: Rows, runtime: RuntimeTraits) -> np.ndarray:
    """Communication buffers: DDP/FSDP reduce buckets, ZeRO-3's gathered units, offload staging.

    ZeRO-3 holds the unit being computed, the one prefetched and the one being reduced (three
    gathered 16-bit copies); the largest unit is a block with the experts it gathers
    (params.largest_block_unit), or the embedding/head where that is larger (a 128K vocabulary
    at h = 4096 is 2x a Llama-8B block). DeepSpeed's ZeRO-2 stages its gradients in one
    contiguous bucket of memory.DEEPSPEED_REDUCE_BUCKET_ELEMENTS (the deepspeed runtime, which
    RuntimeTraits.pipeline_engine_reduce marks). Megatron-Core's allgather MoE dispatcher
    keeps the global buffer it gathers a block's tokens into
    (moe_dispatch.all_gather_buffer_bytes)."""
    has_dp = r.shard > 1
    # FSDP2 wraps a layer's experts in a unit of their own where they have an expert mesh
    # (autoplan: runtime/expert_parallel.apply_expert_fsdp at ep * etp > 1; torchtitan's
    # apply_fsdp fully_shards transformer_block.moe.experts apart at ep > 1); Megatron-FSDP's
    # unit is the TransformerLayer with its experts (dp_comm._dp_comm)
    experts_apart = runtime.fsdp2_copies & (r.ep * r.etp > 1)
    largest_unit = np.maximum(params.largest_block_unit(model, r.tp, r.ep, r.etp, experts_apart),
                              r.vocab * model.hidden_size / r.tp)
    # under a pipeline that defers resharding (unsharded_accumulation) the gathered weights
    # stay whole, counted with the parameters: its reductions stage in buckets as ZeRO-2's do
    per_unit = (r.zero == 3) & ~r.unsharded_accumulation
    zero3_gather = np.where(per_unit & has_dp, 3.0 * r.weight_bytes * largest_unit, 0.0)
    # allocated whatever the data-parallel degree (setup_buckets does not ask)
    deepspeed_bucket = runtime.pipeline_engine_reduce & (r.zero == 2)
    return (np.where(has_dp & ~per_unit & ~deepspeed_bucket, memory.DDP_BUCKET_BYTES, 0.0)
            + np.where(deepspeed_bucket,
                       memory.DEEPSPEED_REDUCE_BUCKET_ELEMENTS * r.weight_bytes, 0.0)
            + zero3_gather
            + np.where(r.offload_optimizer | r.offload_params, memory.DDP_BUCKET_BYTES, 0.0)
            + (moe_dispatch.all_gather_buffer_bytes(model, r)
               if runtime.ep_dispatcher == "allgather" else 0.0))
