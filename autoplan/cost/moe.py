"""Mixture-of-experts cost terms, per rank and micro-batch, in numpy: routed token counts, the
expert GEMMs, router and shared experts, fp8 casts, routed activations and expert states; zeros
for a dense model. moe_dispatch.py prices the token exchange, latent_attention.py MLA.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import compute, elementwise, latent_attention, params
from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


def moe_share(model: ModelSpec) -> float:
    """Share of blocks that are MoE (they are taken as spread evenly over pipeline stages)."""
    return params.moe_layers(model) / model.num_layers


def busiest_factor(model: ModelSpec) -> float:
    """Tokens of the busiest expert over the mean: the stated load_imbalance, capped by the
    capacity factor where tokens past it are dropped (GShard, Lepikhin et al. 2020 §2.2)."""
    moe = model.moe
    assert moe is not None
    cap = moe.capacity_factor
    return moe.load_imbalance if cap is None else min(moe.load_imbalance, cap)


def dispatched_tokens(model: ModelSpec, r: Rows) -> np.ndarray:
    """Tokens one rank sends into the dispatch per MoE block and micro-batch: its sequence
    share b*s/cp, split over tp (Megatron-Core requires sequence parallelism with TP and MoE),
    regathered over etp (the expert-TP group computes the same tokens)."""
    return r.b * model.seq_len / r.cp / r.tp * r.etp


def routed_tokens(model: ModelSpec, r: Rows) -> np.ndarray:
    """Token copies the busiest rank's experts compute per MoE block and micro-batch: each of
    the EP group's dispatched tokens goes to top-k experts, E/ep of which sit on this rank, so
    tokens*k on average (GShard's even share tokens*k/E per expert), times the busiest
    factor."""
    assert model.moe is not None
    return dispatched_tokens(model, r) * model.moe.experts_per_token * busiest_factor(model)


def expert_gemms(model: ModelSpec, r: Rows) -> list[tuple[np.ndarray, np.ndarray]]:
    """(FLOPs on the busiest rank, FLOPs of one expert's GEMM) of the routed experts' forward
    GEMMs: gate+up fused (2f wide for gated MLPs) and down, each split over etp. A grouped GEMM
    runs at the efficiency of its per-expert GEMM (Megatron-Core --moe-grouped-gemm, CUTLASS
    grouped GEMM: one launch over the experts, each tile from one expert's problem)."""
    moe = model.moe
    assert moe is not None
    h, f = model.hidden_size, moe.expert_ffn_hidden_size / r.etp
    tokens = routed_tokens(model, r)
    per_expert = tokens * r.ep / moe.num_experts
    up = (2.0 if model.gated_mlp else 1.0) * f
    return [(2.0 * tokens * h * up, 2.0 * per_expert * h * up),
            (2.0 * tokens * f * h, 2.0 * per_expert * f * h)]


def _dense_mlp_s(model: ModelSpec, profile: ClusterProfile, peak: float, tokens: np.ndarray,
                 tp: np.ndarray) -> np.ndarray:
    """Forward seconds compute.layer_times_s charges for a block's dense MLP GEMMs (the last
    two of its GEMM list), which a MoE block does not run."""
    flops = compute.gemm_flops_per_layer(model, tokens, tp)[2:]
    shapes = compute.gemm_shapes_per_layer(model, tokens, tp)[2:]
    return sum((compute.gemm_time_s(g, profile, peak, s) for g, s in zip(flops, shapes,
                                                                         strict=True)),
               np.zeros_like(np.asarray(tokens, float)))


def moe_block_forward_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows,
                        expert_peak: float | None = None) -> np.ndarray:
    """Forward seconds a MoE block adds over the dense block of the same model on the busiest
    rank: routed expert GEMMs (at `expert_peak` where the runtime runs them at another peak
    than the block's other GEMMs: 16-bit experts in an fp8 run) + router + shared experts -
    the dense MLP it replaces."""
    if model.moe is None:
        return np.zeros_like(r.b)
    moe = model.moe
    tokens = r.b * model.seq_len / r.cp
    routed_peak = peak if expert_peak is None else expert_peak
    experts = sum(flops / (routed_peak * profile.efficiency.matmul(one))
                  for flops, one in expert_gemms(model, r))
    # router: h x E scores on the dispatched tokens in router_dtype (Megatron-Core TopKRouter
    # with --moe-router-dtype; DeepSeek-V3 §3.3 keeps it in fp32)
    router_peak = profile.device.peak_flops_per_s.get(moe.router_dtype, peak)
    router_flops = 2.0 * dispatched_tokens(model, r) / r.etp * model.hidden_size * moe.num_experts
    router = router_flops / (router_peak * profile.efficiency.matmul(router_flops))
    shared: np.ndarray | float = 0.0
    if moe.num_shared_experts:  # a dense MLP of n_shared * f, tensor-parallel like the block's
        wide = model.replace(ffn_hidden_size=moe.num_shared_experts * moe.expert_ffn_hidden_size,
                             moe=None)
        shared = _dense_mlp_s(wide, profile, peak, tokens, r.tp)
    return experts + router + shared - _dense_mlp_s(model, profile, peak, tokens, r.tp)


def fp8_cast_delta_bytes(model: ModelSpec, r: Rows, dispatch_bytes: float | None = None,
                         routed: bool = True) -> np.ndarray:
    """Bytes an fp8 MoE block's casts move per micro-batch over those elementwise.fp8_cast_bytes
    counts for the dense block (forward + backward, read 2 and write 1 byte per element, as
    Transformer Engine casts every FP8 GEMM's input forward and output gradient backward): the
    routed experts cast each token copy's fc1 input (h) and fc2 input (f_e / etp) and the output
    gradients of fc1 (2 f_e / etp gated) and fc2 (h); shared experts the rank's tokens alike;
    the dense MLP's h + f/tp inputs and up/tp + h gradients are not run. With an fp8 dispatch
    (RuntimeTraits.ep_dispatch_bytes 1: DeepSeek-V3 §3.3.2 quantizes before the all-to-all)
    fc1's input is cast once per token, before it is copied. `routed` False: the runtime's
    routed experts run 16-bit (RuntimeTraits.fp8_experts) and cast nothing."""
    if model.moe is None:
        return np.zeros_like(np.asarray(r.b, float))
    moe, h = model.moe, model.hidden_size
    tokens = r.b * model.seq_len / r.cp
    copies = routed_tokens(model, r)
    casts = copies * elementwise.mlp_cast_widths(model, moe.expert_ffn_hidden_size / r.etp)
    if dispatch_bytes is not None and dispatch_bytes < 2.0:  # fc1's input cast before copying
        casts = casts - (copies - dispatched_tokens(model, r)) * h
    casts = casts if routed else 0.0 * casts
    shared = (tokens * elementwise.mlp_cast_widths(
        model, moe.num_shared_experts * moe.expert_ffn_hidden_size / r.tp)
        if moe.num_shared_experts else 0.0)
    dense = tokens * elementwise.mlp_cast_widths(model, model.ffn / r.tp)
    return moe_share(model) * 3.0 * (casts + shared - dense)


def block_forward_delta_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows,
                          expert_peak: float | None = None) -> np.ndarray:
    """Forward seconds a mean block of this model adds over compute.layer_times_s's block
    (backward is twice it: two GEMMs per forward GEMM); zero for a dense model. `expert_peak`:
    as moe_block_forward_s."""
    return moe_share(model) * moe_block_forward_s(model, profile, peak, r, expert_peak) + \
        latent_attention.mla_block_forward_s(model, profile, peak, r)


def routed_activation_parts(model: ModelSpec, r: Rows, parts: dict[str, np.ndarray]
                            ) -> dict[str, np.ndarray]:
    """activations.activation_elements_per_layer's parts of a mean block with MoE blocks' MLP
    activations in place of the dense MLP's: each routed token copy keeps its expert MLP's
    activations (mlp_act, mlp_mid at the expert width split by etp) and its permuted input
    (gemm_in: 2*k*tokens*h, the grouped GEMM's input), the shared experts their own; 16-bit,
    as activations.py counts (Megatron-Core docs, "MoE": activation memory grows with top-k).
    mlp_act_dense/mlp_mid_dense (the dense blocks' share, `dense_share` of the blocks) and
    mlp_act_routed/mlp_mid_routed (the routed experts') split mlp_act and mlp_mid for
    recompute.modules mlp and moe_act (activations.module_kept_bytes)."""
    if model.moe is None:
        return parts
    moe, share = model.moe, moe_share(model)
    copies = routed_tokens(model, r)
    tokens = r.b * model.seq_len / r.cp
    f_e = moe.expert_ffn_hidden_size
    gated = model.gated_mlp
    routed_width = copies * f_e / r.etp
    width = routed_width + tokens * moe.num_shared_experts * f_e / r.tp
    moe_act = (4.0 if gated else 2.0) * width
    ratio_mid = np.where(parts["mlp_act"] > 0, parts["mlp_mid"] / np.maximum(
        parts["mlp_act"], 1e-30), 0.5 if gated else 1.0)
    out = dict(parts)
    out["mlp_act"] = (1.0 - share) * parts["mlp_act"] + share * moe_act
    out["mlp_mid"] = (1.0 - share) * parts["mlp_mid"] + share * moe_act * ratio_mid
    # what recompute.modules frees (activations.module_kept_bytes): mlp the dense blocks' MLP
    # tensors only (Megatron-Core checkpoints no MoE block under mlp), moe_act the routed
    # experts' activation outputs (fc2's saved inputs; not the shared experts')
    out["dense_share"] = np.asarray(1.0 - share)
    out["mlp_act_dense"] = (1.0 - share) * parts["mlp_act"]
    out["mlp_mid_dense"] = (1.0 - share) * parts["mlp_mid"]
    out["mlp_act_routed"] = share * (4.0 if gated else 2.0) * routed_width
    out["mlp_mid_routed"] = out["mlp_act_routed"] * ratio_mid
    out["gemm_in_routed"] = share * 2.0 * copies * model.hidden_size
    out["gemm_in"] = parts["gemm_in"] + out["gemm_in_routed"]
    return out


def eager_moe_bytes(model: ModelSpec, r: Rows, precision: str) -> np.ndarray:
    """Bytes per mean block and micro-batch that autoplan's eager MoE layer keeps beyond
    routed_activation_parts (RuntimeTraits.moe_eager_tensors). Per token the layer routes: the
    k expert outputs the gates multiply (k*h at the activations' width), the router's fp32
    logits and the storage its top-k indices view (E * (4 + 8)), the fp32 softmax of the
    picked logits and the int64 indices of the chosen experts, the gather and the reorder
    (k * (4 + 8 + 8)). A 16-bit run whose router computes in fp32 also keeps the router's
    fp32 copy of its input in place of the 16-bit norm output it is made from, which nothing
    else in the layer keeps (+2h), and the 16-bit gates (+2k), and once per micro-batch the
    fp32 copy of the router weight (h*E*4). Counted with saved-tensor hooks on the runtime's
    block, exact to the byte over eleven shapes (h 48-160, k 1-6, E 4-32) in fp32 and bf16
    beside the per-token statistics activations.py leaves out of every block (norm rstd, attention
    logsumexp: tests/unit/runtime/test_recompute_moe.py recounts). A 16-bit router (not
    counted) is priced as the 16-bit count without the upcasts. The router is replicated
    over tp, so each tp rank routes the rank's whole sequence."""
    if model.moe is None:
        return np.zeros_like(np.asarray(r.b, float))
    moe, h = model.moe, model.hidden_size
    k, e = moe.experts_per_token, moe.num_experts
    tokens = np.asarray(r.b, float) * model.seq_len / np.asarray(r.cp, float)
    if precision == "fp32":
        per_token, per_layer = 4.0 * k * h + 12.0 * e + 20.0 * k, 0.0
    else:
        per_token, per_layer = 2.0 * k * h + 12.0 * e + 22.0 * k, 0.0
        if moe.router_dtype == "fp32":
            per_token, per_layer = per_token + 2.0 * h, 4.0 * h * e
    return moe_share(model) * (per_token * tokens + per_layer)


def expert_psi(model: ModelSpec, r: Rows, layers: np.ndarray) -> np.ndarray:
    """Routed expert parameters one GPU of a stage of `layers` blocks holds."""
    return params.expert_params_per_rank(model, r.ep, r.etp, layers)


def model_flops_per_sequence(model: ModelSpec) -> float:
    """Model FLOPs to train on one sequence from ACTIVE parameters: 6 * N per token for every
    GEMM weight a token passes through (Kaplan et al. 2020 §2.1; DeepSeek-V3 counts MFU so),
    plus the attention core and the logits as compute.model_flops_per_sequence counts them."""
    s = model.seq_len
    weights = params.active_params(model, embedding=False) - model.hidden_size * (
        0 if model.tie_embeddings else model.vocab_size)
    core = float(compute.attention_core_flops(model, np.array(1), np.array(1), np.array(1)))
    logits = 2.0 * s * model.hidden_size * model.vocab_size
    return 6.0 * s * weights + 3.0 * (model.num_layers * core + logits)
