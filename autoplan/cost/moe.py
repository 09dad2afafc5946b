"""Mixture-of-experts and latent-attention cost terms, per rank and micro-batch, in numpy.

What a MoE block costs beyond the dense block compute.layer_times_s prices for the same model:
expert GEMMs at the routed token counts, the router, shared experts, the all-to-all dispatch and
combine, routed-token activations, expert states sharded by EP x ETP and the expert-DP group;
and multi-head latent attention's projections in place of the standard ones. A dense model
(moe and mla None) gets zeros, so its numbers are those of the dense terms alone.
"""

from __future__ import annotations

from math import comb

import numpy as np

from autoplan.cost import comm, compute, elementwise, params
from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.moe_spec import MoESpec

ALL_TO_ALLS_PER_LAYER = 4.0
"""Dispatch and combine in forward, and their mirror images in backward (Megatron-Core
MoEAlltoAllTokenDispatcher: token_permutation and token_unpermutation, each one all-to-all
over the EP group; autograd runs the transposed all-to-all for each)."""


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


def _mla_gemms(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray
               ) -> list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
    """MLA's forward GEMMs (FLOPs, output shape) on one tp rank (DeepSeek-V2 §2.1): the down
    projections (h -> d_c', h -> d_c + d_R) are replicated, the up projections and the output
    are split by heads over tp (Megatron-Core MLASelfAttention)."""
    mla, h, a = model.mla, model.hidden_size, model.num_heads
    assert mla is not None
    t, tp = np.asarray(tokens, float), np.asarray(tp, float)
    heads = a / tp
    out = []
    if mla.q_lora_rank is None:
        out.append((2 * t * h * heads * mla.qk_head_dim, (t, heads * mla.qk_head_dim)))
    else:
        out.append((2 * t * h * mla.q_lora_rank + 0 * tp, (t, mla.q_lora_rank + 0 * tp)))
        out.append((2 * t * mla.q_lora_rank * heads * mla.qk_head_dim,
                    (t, heads * mla.qk_head_dim)))
    kv_down = mla.kv_lora_rank + mla.qk_rope_head_dim
    out.append((2 * t * h * kv_down + 0 * tp, (t, kv_down + 0 * tp)))
    kv_up = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out.append((2 * t * mla.kv_lora_rank * kv_up, (t, kv_up)))
    out.append((2 * t * heads * mla.v_head_dim * h, (t, h + 0 * tp)))
    return out


def mla_block_forward_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows
                        ) -> np.ndarray:
    """Forward seconds MLA's projections take over the standard q/k/v/o GEMMs compute.py
    charges for the same model (head_dim = the core's mean width, (qk + v) / 2, keeps the
    attention core's FLOPs exact)."""
    if model.mla is None:
        return np.zeros_like(r.b)
    tokens = r.b * model.seq_len / r.cp
    mla = np.sum([compute.gemm_time_s(g, profile, peak, s)
                  for g, s in _mla_gemms(model, tokens, r.tp)], axis=0)
    flops = compute.gemm_flops_per_layer(model, tokens, r.tp)[:2]
    shapes = compute.gemm_shapes_per_layer(model, tokens, r.tp)[:2]
    standard = np.sum([compute.gemm_time_s(g, profile, peak, s)
                       for g, s in zip(flops, shapes, strict=True)], axis=0)
    return np.asarray(mla - standard)


def _mla_ups(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray
             ) -> list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
    """_mla_gemms' up projections (query latent -> heads, key/value latent -> heads); only
    kv_up without a query latent."""
    assert model.mla is not None
    gemms = _mla_gemms(model, tokens, tp)
    return [gemms[1], gemms[3]] if model.mla.q_lora_rank is not None else [gemms[2]]


def mla_up_flops(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Forward FLOPs of MLA's up projections on one tp rank (0 without MLA): what DeepSeek-V3's
    recompute re-runs, for HFU (recompute_time.recompute_flops_per_step)."""
    if model.mla is None:
        return 0.0 * np.asarray(tokens, float)
    return np.sum([g for g, _ in _mla_ups(model, tokens, tp)], axis=0)


def mla_up_forward_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows
                     ) -> np.ndarray:
    """Forward seconds of MLA's up projections (_mla_ups), the GEMMs DeepSeek-V3's recompute
    re-runs (report §3.2.3); 0 without MLA."""
    if model.mla is None:
        return np.zeros_like(r.b)
    ups = _mla_ups(model, r.b * model.seq_len / r.cp, r.tp)
    return np.sum([compute.gemm_time_s(g, profile, peak, s) for g, s in ups], axis=0)


def block_forward_delta_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows,
                          expert_peak: float | None = None) -> np.ndarray:
    """Forward seconds a mean block of this model adds over compute.layer_times_s's block
    (backward is twice it: two GEMMs per forward GEMM); zero for a dense model. `expert_peak`:
    as moe_block_forward_s."""
    return moe_share(model) * moe_block_forward_s(model, profile, peak, r, expert_peak) + \
        mla_block_forward_s(model, profile, peak, r)


def _none_of(pool: float, part: float, k: int) -> float:
    """P(k experts drawn evenly without replacement from `pool` miss a given `part` of them):
    C(pool - part, k) / C(pool, k), as a product without big integers."""
    out = 1.0
    for i in range(k):
        out *= max(pool - part - i, 0.0) / (pool - i)
    return out


def distinct_nodes(moe_spec: MoESpec, nodes: int) -> float:
    """Expected nodes holding at least one of a token's k experts, its experts spread evenly
    (E/N each, in order) over `nodes` nodes. Group-limited routing (route_groups G,
    route_groups_per_token M: DeepSeek-V3 §2.1.2 node-limited routing, each token to at most
    M = 4 nodes; HF n_group / topk_group) draws the k from the M chosen groups' M*E/G experts.
    A node holding c = G/N whole groups has X of them chosen, X hypergeometric (G, c, M), and
    misses all k with _none_of(M*E/G, X*E/G, k); a group over N/G nodes is chosen with
    probability M/G and its node then misses with _none_of(M*E/G, E/N, k). Groups that neither
    nest in nodes nor nodes in them are priced as ungrouped (more nodes: the safe side)."""
    e, k = float(moe_spec.num_experts), moe_spec.experts_per_token
    g, m = moe_spec.route_groups, moe_spec.route_groups_per_token or moe_spec.route_groups
    if nodes <= 1:
        return 1.0
    if g > 1 and g % nodes == 0:
        c, pool = g // nodes, m * e / g
        hits = sum(comb(c, x) * comb(g - c, m - x) / comb(g, m) * (1.0 - _none_of(
            pool, x * e / g, k)) for x in range(max(0, m - (g - c)), min(c, m) + 1))
        return nodes * hits
    if g > 1 and nodes % g == 0:
        pool = m * e / g
        return nodes * (m / g) * (1.0 - _none_of(pool, e / nodes, k))
    return nodes * (1.0 - _none_of(e, e / nodes, k))


def node_dedup_share(model: ModelSpec, r: Rows, gpus_per_node: int) -> np.ndarray:
    """Share of a token's cross-node expert copies a node-deduplicating dispatcher still sends
    through the NICs: it sends a token once to each other node holding one of its experts and
    forwards it to those experts over NVLink (DeepSeek-V3 report §3.2.2; DeepEP's internode
    kernels). Of the D = distinct_nodes nodes a token's k experts sit on, a share (N - 1)/N are
    other nodes by symmetry, against the k (N - 1) / N copies an all-to-all sends: share =
    D / k, 1 inside one node. Qwen3-235B (top-8 of 128, no groups) on EP 32 over 4 nodes:
    0.45; DeepSeek-V3 (top-8 of 256 in 8 groups, 4 per token) on EP 64 over 8 nodes: 0.45
    (0.66 were its routing not node-limited)."""
    moe = model.moe
    assert moe is not None
    per_node = comm.members_per_node(r.etp, r.ep, gpus_per_node)
    nodes = np.maximum(np.asarray(r.ep, float) / per_node, 1.0)
    k = moe.experts_per_token
    uniq, where = np.unique(np.round(nodes), return_inverse=True)  # a few node counts
    share = np.array([distinct_nodes(moe, int(n)) / k for n in uniq])[where].reshape(
        np.shape(nodes))
    return np.where(nodes > 1.0, np.minimum(share, 1.0), 1.0)


def all_to_all_per_block_s(model: ModelSpec, profile: ClusterProfile, r: Rows,
                           dispatch_bytes: float | None = None,
                           dedup_nodes: bool = False, all_gather: bool = False) -> np.ndarray:
    """Seconds of a mean block's all-to-alls per micro-batch (forward and backward): four of
    dispatched tokens x k x h elements over the EP group, priced by tier (comm.ALL_TO_ALL; EP
    ranks stride etp in Megatron-Core's expert grid, so a group stays in a node while ep * etp
    <= gpus_per_node, else it sends through each GPU's NIC); the busiest rank receives the
    busiest factor more. Two of them (the dispatch directions) at `dispatch_bytes` per element
    where the runtime quantizes them (runtimes.RuntimeTraits.ep_dispatch_bytes), the combines
    at the activations' width. `dedup_nodes`: a dispatcher that sends each token once per
    destination node (node_dedup_share; DeepEP; RuntimeTraits.ep_dispatcher = deepep), whose
    group crossing nodes is then bound by the NIC leg it shrinks (the NVLink forwarding inside
    the node is not priced apart). The NIC leg keeps the profile's message-size curve at the
    per-peer size. DeepEP's own table (README "Performance", now docs/legacy.md: internode
    dispatch 43/58/51 GB/s at EP 16/32/64 on 50 GB/s CX7 NICs, H800, DeepSeek-V3's shape) is
    not a wire rate: tests/test_internode.py divides the (token, destination node) pairs,
    the sender's own node included, by the whole dispatch time, and the kernel sends its own
    node's tokens without the NIC (csrc/kernels/internode.cu; the V2 README: "logical
    bandwidth ... contains local rank traffic"). Less the own node's share of a token's
    nodes (about 1/2, 1/4, 1/8 at 2, 4, 8 nodes, tokens routed to at most four nodes) those are
    ~21, ~43 and ~45 GB/s through the NIC, at or under the profile curve's 0.85 of 50 GB/s for
    large messages, so the curve is kept. `all_gather`: the dispatcher gathers every token
    instead (all_gather_dispatch_s)."""
    if model.moe is None:
        return np.zeros_like(r.b)
    if all_gather:
        return all_gather_dispatch_s(model, profile, r)
    gpn = profile.gpus_per_node
    elements = (dispatched_tokens(model, r) / r.etp * model.moe.experts_per_token
                * busiest_factor(model) * model.hidden_size)
    if dedup_nodes:
        elements = elements * node_dedup_share(model, r, gpn)

    def one(width: float) -> np.ndarray:
        return comm.collective_time_s(comm.ALL_TO_ALL, elements * width, r.ep,
                                      comm.intra_node(r.etp, r.ep, gpn), profile,
                                      per_node=comm.members_per_node(r.etp, r.ep, gpn))

    dispatch = one(r.weight_bytes if dispatch_bytes is None else dispatch_bytes)
    half = ALL_TO_ALLS_PER_LAYER / 2.0
    return moe_share(model) * half * (dispatch + one(r.weight_bytes))


def routed_activation_parts(model: ModelSpec, r: Rows, parts: dict[str, np.ndarray]
                            ) -> dict[str, np.ndarray]:
    """memory.activation_elements_per_layer's parts of a mean block with MoE blocks' MLP
    activations in place of the dense MLP's: each routed token copy keeps its expert MLP's
    activations (mlp_act, mlp_mid at the expert width split by etp) and its permuted input
    (gemm_in: 2*k*tokens*h, the grouped GEMM's input), the shared experts their own; 16-bit,
    as memory.py counts (Megatron-Core docs, "MoE": activation memory grows with top-k).
    mlp_act_dense/mlp_mid_dense (the dense blocks' share, `dense_share` of the blocks) and
    mlp_act_routed/mlp_mid_routed (the routed experts') split mlp_act and mlp_mid for
    recompute.modules mlp and moe_act (memory.module_kept_bytes)."""
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
    # what recompute.modules frees (memory.module_kept_bytes): mlp the dense blocks' MLP
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
    beside the per-token statistics memory.py leaves out of every block (norm rstd, attention
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


def mla_latent_bytes(model: ModelSpec, r: Rows) -> np.ndarray:
    """16-bit bytes per block and micro-batch of MLA's latents: the query latent (d_c') and the
    key/value latent with the shared rotary key (d_c + d_R), the down projections' outputs,
    replicated over tp like the down projections (DeepSeek-V2 §2.1); 0 without MLA. A
    recompute that re-runs the up projections keeps them in place of Q, K, V
    (runtimes.SelectiveKind.DEEPSEEK_V3). They are the RMSNorms' inputs that the recompute
    re-norms from (report §3.2.3), not a Linear's input (the normed latents, re-made, are), so
    an fp8 run keeps them 16-bit too (§3.3.3 caches Linear inputs in FP8)."""
    mla = model.mla
    if mla is None:
        return np.zeros_like(r.b)
    width = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
    return 2.0 * r.b * model.seq_len / r.cp * width / np.where(r.sp, r.tp, 1.0)


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


def all_gather_dispatch_s(model: ModelSpec, profile: ClusterProfile, r: Rows,
                          forward_only: bool = False) -> np.ndarray:
    """Seconds of a mean block's token exchange per micro-batch (forward and backward) under
    Megatron-Core's allgather dispatcher (--moe-token-dispatcher-type allgather, its default;
    megatron/core/transformer/moe/token_dispatcher.py, MoEAllGatherTokenDispatcher): over the
    expert-TP x EP group (tp_ep_group) the dispatch all-gathers every rank's tokens ("[(S/TP)*B,
    H] -> [S*B*EP, H]"), whatever their routing, with the routing map (bool) and the router's
    probabilities ([S*B*EP, num_experts]) beside them; each rank picks those for its own
    experts, and the combine reduce-scatters the outputs back at the probabilities' dtype
    (`output_total.to(self.local_probs.dtype)`: fp32 under --moe-router-dtype fp32). Autograd
    runs the mirror images in backward: the hidden states' and the probabilities' gathers
    reduce-scatter their gradients, the combine's gathers its own (the routing map is gathered
    under no_grad). The routing map and probabilities are priced over the whole group. Of the
    hidden states, the EP share is priced here, over the EP group placed as the all-to-all's;
    where etp == tp (Megatron's default expert TP) the expert-TP share is the gather and
    reduce-scatter sequence parallelism makes for any MLP, priced with the tensor-parallel
    collectives at the activations' width, so only the combine's wider share is added here.
    (With etp != tp the expert-TP share is priced as tp's, as under the all-to-all.) The
    busiest expert's excess is compute, not traffic: every rank receives every token.
    `forward_only`: the forward's legs alone, which a recomputed block runs again
    (stage_time.recompute_extra_s)."""
    assert model.moe is not None
    gpn = profile.gpus_per_node
    wb = np.asarray(r.weight_bytes, float)
    # Megatron's router returns its scores in the logits' dtype: fp32 under
    # --moe-router-dtype fp32, else the model's own
    pb = np.maximum(ROUTER_BYTES[model.moe.router_dtype], wb)
    tokens = all_gathered_tokens(model, r)
    group = r.etp * r.ep
    one = np.ones_like(np.asarray(group, float))  # the group's ranks are adjacent

    def over(kind: str, nbytes: np.ndarray, size: np.ndarray, stride: np.ndarray) -> np.ndarray:
        return comm.collective_time_s(kind, nbytes, size, comm.intra_node(stride, size, gpn),
                                      profile, per_node=comm.members_per_node(stride, size, gpn))

    ag, rs = comm.ALL_GATHER, comm.REDUCE_SCATTER
    back = 0.0 if forward_only else 1.0  # the backward's legs
    scores = tokens * model.moe.num_experts
    routing = (over(ag, scores * pb, group, one) + over(ag, scores, group, one)
               + back * over(rs, scores * pb, group, one))
    hidden = tokens * model.hidden_size
    # forward: the tokens' gather, the combine's reduce-scatter; backward: their mirror images
    ep_share = (over(ag, hidden * wb, r.ep, r.etp) + over(rs, hidden * pb, r.ep, r.etp)
                + back * (over(rs, hidden * wb, r.ep, r.etp) + over(ag, hidden * pb, r.ep, r.etp)))
    # the combine's expert-TP share at the probabilities' width beyond the activations'
    wider = dispatched_tokens(model, r) * model.hidden_size * (pb - wb)
    etp_combine = np.where(pb > wb, over(rs, wider, r.etp, one)
                           + back * over(ag, wider, r.etp, one), 0.0)
    return np.where(group > 1, moe_share(model) * (routing + ep_share + etp_combine), 0.0)


ROUTER_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
"""Bytes per element of the router's probabilities by model.moe.router_dtype (Megatron's
router returns its scores in the logits' dtype)."""


def all_gathered_tokens(model: ModelSpec, r: Rows) -> np.ndarray:
    """Tokens the allgather dispatcher gathers per MoE block and micro-batch: every rank's
    dispatched tokens over the EP group, b*s/cp * ep where etp == tp ("[S*B*EP, H]")."""
    return dispatched_tokens(model, r) * r.ep


def all_gather_buffer_bytes(model: ModelSpec, r: Rows) -> np.ndarray:
    """Bytes of the buffer Megatron-Core's allgather dispatcher gathers the hidden states into:
    gather_from_sequence_parallel_region(..., use_global_buffer=True) takes it from the global
    memory buffer ("mpu"), which keeps its largest request for the rest of the run; 16-bit
    [S*B*EP, H]. The dispatcher gathers wherever etp > 1 or ep > 1; 0 for a dense model.
    Charged to every stage, as the buffers are, though a stage of only dense blocks (DeepSeek-V3's
    first three) never gathers."""
    if model.moe is None:
        return np.zeros_like(np.asarray(r.b, float))
    gathers = (r.etp > 1) | (r.ep > 1)  # the dispatcher's tp is the expert TP group's
    return np.where(gathers, all_gathered_tokens(model, r) * model.hidden_size
                    * r.weight_bytes, 0.0)
