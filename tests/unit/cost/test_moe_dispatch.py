"""MoE token exchange: the all-to-all's node deduplication (DeepEP), node-limited routing, and
Megatron-Core's allgather dispatcher with its routing scores and gather buffer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost import moe, moe_dispatch
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_table import plan_to_row


def _plan(model, gpus, profile="h100-sxm-80gb", gbs=512, mbs=1, **par):
    return Plan(model=model, cluster=ClusterRef(profile, gpus), parallel=Parallel(**par),
                batch=Batch(micro_batch_size=mbs, global_batch_size=gbs), zero_stage=1)


def _rows(plan, model):
    from autoplan.cost.rows import rows_of

    return rows_of(plan_to_row(plan, model), model, "bf16", load_runtime("megatron"))


def test_node_dedup_share_is_the_hypergeometric_expectation():
    from math import comb

    m = PRESETS["qwen3-235b-a22b"]
    r = _rows(_plan("qwen3-235b-a22b", 256, dp=16, tp=2, pp=8, ep=32), m)
    # 4 nodes of 32 experts: a node holds none of a token's 8 with C(96,8)/C(128,8)
    q = comb(96, 8) / comb(128, 8)
    want = 4 * (1 - q) / 8  # (3 (1-q) nodes sent once) / (8 * 3/4 copies)
    assert float(moe_dispatch.node_dedup_share(m, r, 8)[0]) == pytest.approx(want, rel=1e-12)
    assert float(moe_dispatch.node_dedup_share(m, r, 8)[0]) == pytest.approx(0.4536, abs=1e-4)
    inside = _rows(_plan("qwen3-235b-a22b", 256, dp=128, tp=2, ep=8), m)
    assert float(moe_dispatch.node_dedup_share(m, inside, 8)[0]) == 1.0  # EP 8 stays in one node
    # as many nodes as a token has experts (routing not node-limited): below one copy each
    ds = PRESETS["deepseek-v3"]
    ds = ds.replace(moe=replace(ds.moe, route_groups=1, route_groups_per_token=None))
    wide = _rows(_plan("deepseek-v3", 2048, "h800-sxm-80gb", gbs=15360, dp=128, pp=16, ep=64),
                 ds)
    assert 0.5 < float(moe_dispatch.node_dedup_share(ds, wide, 8)[0]) < 1.0
    profile = load_profile("h100-sxm-80gb")
    plain = moe_dispatch.all_to_all_per_block_s(m, profile, r)
    dedup = moe_dispatch.all_to_all_per_block_s(m, profile, r, dedup_nodes=True)
    assert float(dedup[0]) < float(plain[0])
    same = moe_dispatch.all_to_all_per_block_s(m, profile, inside, dedup_nodes=True)
    assert float(same[0]) == float(moe_dispatch.all_to_all_per_block_s(m, profile, inside)[0])


def test_node_limited_routing_sends_to_fewer_nodes():
    """DeepSeek-V3: top-8 of 256 experts in 8 groups, 4 groups per token (node-limited)."""
    from math import comb

    ds = PRESETS["deepseek-v3"].moe
    assert (ds.route_groups, ds.route_groups_per_token) == (8, 4)
    free = replace(ds, route_groups=1, route_groups_per_token=None)
    # 8 nodes, one group each: a node's group is chosen with 4/8, then misses the 8 of 128
    q = comb(96, 8) / comb(128, 8)
    assert moe_dispatch.distinct_nodes(ds, 8) == pytest.approx(8 * 0.5 * (1 - q), rel=1e-12)
    assert moe_dispatch.distinct_nodes(free, 8) == pytest.approx(
        8 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)
    # 4 nodes of two groups: X of a node's 2 groups among the 4 chosen of 8
    p1, p2 = 2 * comb(6, 3) / comb(8, 4), comb(6, 2) / comb(8, 4)
    want = 4 * (p1 * (1 - q) + p2 * (1 - comb(64, 8) / comb(128, 8)))
    assert moe_dispatch.distinct_nodes(ds, 4) == pytest.approx(want, rel=1e-12)
    # 16 nodes, each group over two: chosen with 4/8, then misses the node's 16 of 128
    assert moe_dispatch.distinct_nodes(ds, 16) == pytest.approx(
        16 * 0.5 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    assert moe_dispatch.distinct_nodes(ds, 8) < moe_dispatch.distinct_nodes(free, 8) <= 8
    assert moe_dispatch.distinct_nodes(ds, 1) == 1.0


def test_deepep_runtime_sends_one_copy_per_node_only_across_nodes():
    """runtime ep_dispatcher deepep (megatron-deepep): the estimate's ep_comm shrinks for a
    group across nodes by node_dedup_share's NIC leg, and not at all inside one node."""
    m = PRESETS["qwen3-235b-a22b"]
    across = _plan("qwen3-235b-a22b", 256, gbs=2048, dp=16, tp=2, pp=8, ep=32)
    plain = estimate_plan(across, model=m, runtime="megatron")
    deepep = estimate_plan(across, model=m, runtime="megatron-deepep")
    assert load_runtime("megatron-deepep").ep_dispatcher == "deepep"
    assert load_runtime("megatron").ep_dispatcher == "alltoall"
    # the NIC leg sets the time, so ep_comm falls by the share, a little less as the smaller
    # per-peer messages reach less of the link (the profile's inter_node curve)
    share = float(moe_dispatch.node_dedup_share(m, _rows(across, m), 8)[0])
    ratio = deepep.time["ep_comm"] / plain.time["ep_comm"]
    assert share < ratio < 1.2 * share
    assert deepep.time["compute"] == plain.time["compute"]  # only the dispatch changes
    inside = _plan("qwen3-235b-a22b", 64, gbs=512, dp=8, tp=1, pp=8, ep=8)
    assert estimate_plan(inside, model=m, runtime="megatron-deepep").time["ep_comm"] == \
        estimate_plan(inside, model=m, runtime="megatron").time["ep_comm"] > 0.0


def test_allgather_dispatcher_moves_every_token_whatever_the_routing():
    """ep_dispatcher allgather (megatron-allgather, Megatron's default dispatcher): every rank
    receives all of its EP group's tokens, so its traffic does not grow with top-k as the
    all-to-all's does; at Mixtral's top-2 of 8 inside one node its hidden-state legs move
    ep / k = 4x the all-to-all's bytes, and under an fp32 router the combine's two legs run at
    the probabilities' width, 8x (less in time: the larger messages reach more of the link).
    Megatron gathers into its global memory buffer, which stays allocated."""
    profile = load_profile("h100-sxm-80gb")
    m = PRESETS["mixtral-8x7b"]
    top4 = m.replace(moe=replace(m.moe, experts_per_token=4))
    r2, r4 = (_rows(_plan("mixtral-8x7b", 8, dp=8, ep=8), x) for x in (m, top4))
    a2a = [float(moe_dispatch.all_to_all_per_block_s(x, profile, r)[0])
           for x, r in ((m, r2), (top4, r4))]
    gather = [float(moe_dispatch.all_to_all_per_block_s(x, profile, r, all_gather=True)[0])
              for x, r in ((m, r2), (top4, r4))]
    assert gather[0] == gather[1] > 0.0
    assert a2a[1] > 1.5 * a2a[0]
    assert moe.busiest_factor(m) == 1.0
    assert m.moe.router_dtype == "fp32"
    assert 3.0 * a2a[0] < gather[0] < 6.0 * a2a[0]
    bf16_router = m.replace(moe=replace(m.moe, router_dtype="bf16"))
    bf16_gather = float(moe_dispatch.all_gather_dispatch_s(bf16_router, profile, _rows(
        _plan("mixtral-8x7b", 8, dp=8, ep=8), bf16_router))[0])
    assert 2.0 * a2a[0] < bf16_gather < 4.0 * a2a[0]
    # no EP: the expert-TP gather is sequence parallelism's, priced with the TP collectives
    tp_only = _rows(_plan("mixtral-8x7b", 8, dp=4, tp=2), m)
    assert float(moe_dispatch.all_gather_dispatch_s(m, profile, tp_only)[0]) == 0.0
    plan = _plan("mixtral-8x7b", 64, gbs=256, dp=16, pp=4, ep=8)
    plain = estimate_plan(plan, model=m, runtime="megatron")
    gathered = estimate_plan(plan, model=m, runtime="megatron-allgather")
    assert load_runtime("megatron-allgather").ep_dispatcher == "allgather"
    assert gathered.time["compute"] == plain.time["compute"]  # only the exchange changes
    assert gathered.time["ep_comm"] > 2.0 * plain.time["ep_comm"]
    assert gathered.runtime == "megatron-allgather"
    # the gather buffer: [S*B*EP, H] in 16 bits (Mixtral: 4096 tokens x 8 ranks x 4096 wide)
    assert gathered.memory["buffers"] - plain.memory["buffers"] == 4096 * 8 * 4096 * 2


def test_allgather_gathers_routing_scores_over_the_expert_tp_x_ep_group():
    """MoEAllGatherTokenDispatcher gathers the routing map (1 byte) and the probabilities (the
    router's dtype) of every token over tp_ep_group, and its backward reduce-scatters the
    probabilities' gradient: their time grows with the expert count while the hidden states'
    does not. With expert TP alone (ep 1) those gathers still run, and an fp32 router's combine
    is wider than the sequence-parallel reduce-scatter priced for its expert-TP share."""
    profile = load_profile("h100-sxm-80gb")
    m = PRESETS["mixtral-8x7b"]
    many = m.replace(moe=replace(m.moe, num_experts=512))
    ep8 = _plan("mixtral-8x7b", 8, dp=8, ep=8)
    few, lots = (float(moe_dispatch.all_gather_dispatch_s(x, profile, _rows(ep8, x))[0])
                 for x in (m, many))
    assert lots > few > 0.0
    etp_only = _plan("mixtral-8x7b", 8, dp=4, tp=2, etp=2)
    bf16_router = m.replace(moe=replace(m.moe, router_dtype="bf16"))
    fp32_s, bf16_s = (float(moe_dispatch.all_gather_dispatch_s(x, profile, _rows(etp_only, x))[0])
                      for x in (m, bf16_router))
    assert fp32_s > bf16_s > 0.0
    # a recomputed block runs the forward's legs again: more than half the exchange, by the
    # routing map's gather, which has no backward
    forward = float(moe_dispatch.all_gather_dispatch_s(m, profile, _rows(ep8, m),
                                                       forward_only=True)[0])
    assert few / 2.0 < forward < few
    # the gather buffer follows the dispatcher's group (expert TP x EP), not the dense TP
    tp_only = _rows(_plan("mixtral-8x7b", 8, dp=4, tp=2), m)
    assert float(moe_dispatch.all_gather_buffer_bytes(m, tp_only)[0]) == 0.0
    assert float(moe_dispatch.all_gather_buffer_bytes(m, _rows(etp_only, m))[0]) == 4096 * 4096 * 2
