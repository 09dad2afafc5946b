"""How a MoE block's tokens reach their experts and come back, per rank and micro-batch: the
all-to-all by tier (one copy per node where DeepEP deduplicates), Megatron-Core's allgather
dispatcher and its gather buffer. moe.py counts the routed tokens and prices the experts.
"""

from __future__ import annotations

from math import comb

import numpy as np

from autoplan.cost import comm
from autoplan.cost.moe import busiest_factor, dispatched_tokens, moe_share
from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.moe_spec import MoESpec

ALL_TO_ALLS_PER_LAYER = 4.0
"""Dispatch and combine in forward, and their mirror images in backward (Megatron-Core
MoEAlltoAllTokenDispatcher: token_permutation and token_unpermutation, each one all-to-all
over the EP group; autograd runs the transposed all-to-all for each)."""


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
    (block_time.recompute_extra_s)."""
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
