"""MoE cost terms: all-to-all by tier, expert states by EP and expert-DP, routed activations,
active-parameter MFU, and DeepSeek-V3's published layout on H800 against its published cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost import comm, moe, params
from autoplan.cost.estimate import estimate_plan, estimate_table
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_table import plan_to_row
from tests.benchmark_scripts import load_script


def _plan(model, gpus, profile="h100-sxm-80gb", gbs=512, mbs=1, **par):
    return Plan(model=model, cluster=ClusterRef(profile, gpus), parallel=Parallel(**par),
                batch=Batch(micro_batch_size=mbs, global_batch_size=gbs), zero_stage=1)


def test_all_to_all_sends_n_minus_1_over_n_inside_a_node():
    prof = load_profile("h100-sxm-80gb")
    nbytes = np.array(1e9)
    t8 = comm.collective_time_s(comm.ALL_TO_ALL, nbytes, np.array(8.0), np.array(True), prof)
    bw = prof.intra_node.bytes_per_s * prof.efficiency.intra_node(nbytes / 8)
    assert float(t8) == pytest.approx(7 / 8 * 1e9 / bw + prof.intra_node.latency_s)
    # across 8 nodes the NIC leg (56/64 of the buffer at 50 GB/s) is the slower one
    t64 = comm.collective_time_s(comm.ALL_TO_ALL, nbytes, np.array(64.0), np.array(False), prof,
                                 per_node=np.array(8.0))
    assert float(t64) > 5 * float(t8)


def test_expert_parallelism_splits_expert_states():
    m = PRESETS["mixtral-8x7b"]
    one = estimate_plan(_plan("mixtral-8x7b", 64, dp=8, tp=8, ep=1), model=m)
    eight = estimate_plan(_plan("mixtral-8x7b", 64, dp=8, tp=8, ep=8), model=m)
    expert = params.routed_expert_params(m)
    # bf16 weights, etp 1: every rank of ep 1 holds all routed experts whole, of ep 8 an eighth
    saved = one.memory["params"] - eight.memory["params"]
    assert saved == pytest.approx(2.0 * expert * (1 - 1 / 8), rel=1e-9)
    # ZeRO-1 shards the experts' optimizer over expert-dp = dp*tp/ep: 64 ranks, then 8
    assert one.memory["optimizer"] == pytest.approx(eight.memory["optimizer"], rel=1e-9)
    assert one.time["ep_comm"] == 0.0 < eight.time["ep_comm"]


def test_dense_model_has_no_ep_comm_and_ep_is_refused():
    est = estimate_plan(_plan("llama-3-8b", 8, dp=8), model=PRESETS["llama-3-8b"])
    assert est.time["ep_comm"] == 0.0
    bad = estimate_plan(_plan("llama-3-8b", 8, dp=8, ep=2), model=PRESETS["llama-3-8b"])
    assert any("has no experts" in r for r in bad.reasons)


def test_mfu_counts_active_parameters():
    m = PRESETS["mixtral-8x7b"]
    per_seq = moe.model_flops_per_sequence(m)
    active = params.active_params(m, embedding=False) - m.vocab_size * m.hidden_size
    assert per_seq > 6 * m.seq_len * active  # attention and logits on top
    assert per_seq < 6 * m.seq_len * params.total_params(m) / 3  # far below the total's 6N


def test_load_imbalance_slows_experts_and_capacity_caps_it():
    base = PRESETS["mixtral-8x7b"]
    plan = _plan("mixtral-8x7b", 64, dp=8, tp=8, ep=8)
    times = {}
    for li, cf in ((1.0, None), (1.5, None), (1.5, 1.25)):
        m = base.replace(moe=base.moe.__class__(**{**base.moe.__dict__, "load_imbalance": li,
                                                   "capacity_factor": cf}))
        cols = estimate_table(plan_to_row(plan, m), m, load_profile("h100-sxm-80gb"))
        times[(li, cf)] = float(cols["time_compute"][0])
    assert times[(1.0, None)] < times[(1.5, 1.25)] < times[(1.5, None)]


def test_routed_activations_grow_with_top_k():
    base = PRESETS["mixtral-8x7b"]
    plan = _plan("mixtral-8x7b", 64, dp=8, tp=8, ep=8)
    acts = []
    for k in (1, 2, 4):
        m = base.replace(moe=base.moe.__class__(**{**base.moe.__dict__, "experts_per_token": k}))
        acts.append(estimate_plan(plan, model=m).memory["activations"])
    assert acts[0] < acts[1] < acts[2]


def _moe_accuracy():
    """benchmarks/moe_accuracy.py, the one home of DeepSeek-V3's published plan, by path."""
    return load_script("moe_accuracy")


# DeepSeek-V3 technical report (arXiv 2412.19437), as benchmarks/moe_accuracy.py cites it: the
# published layout (PP16, EP64, ZeRO-1 on 2048 H800s) and its 19.9 s step; the runtime file is
# its framework as the report describes it (DualPipe overlap, FP8 dispatch).
ACCURACY = _moe_accuracy()
DEEPSEEK_STEP_S = ACCURACY.DEEPSEEK_STEP_S
DEEPSEEK_RUNTIME = ACCURACY.DEEPSEEK_RUNTIME
deepseek_v3_plan = ACCURACY.deepseek_v3_plan


def test_deepseek_v3_published_layout_fits_and_is_priced_below_its_all_in_throughput():
    """The published figure is 180K H800 GPU-hours per trillion tokens: wall time of the whole
    pre-training, so every second a step does not spend (restarts, checkpoints, evaluation)
    is in it too, and a faithful step must not exceed it. The report's mechanisms are priced
    (benchmarks/deepseek_v3_runtime.yaml): node-deduplicated dispatch and 20 SMs kept for it."""
    assert DEEPSEEK_STEP_S == pytest.approx(19.9, abs=0.05)
    plan, cluster = deepseek_v3_plan(), ClusterSpec(load_profile("h800-sxm-80gb"), 2048)
    traits = load_runtime(str(DEEPSEEK_RUNTIME))
    est = estimate_plan(plan, cluster, runtime=traits)
    assert est.feasible, est.reasons
    assert est.step_time_s < DEEPSEEK_STEP_S
    # a sanity floor, not an accuracy window: a halved step (a part dropped or priced twice
    # too cheap) falls below it
    assert est.step_time_s > 0.6 * DEEPSEEK_STEP_S
    # how close it comes (issue #13 asks for 20%) is printed by benchmarks/moe_accuracy.py, not
    # asserted: the non-step share of the all-in figure is unknown, and a window met by a
    # quarter of a point would only invite tuning
    # EP64 spans 8 nodes: the all-to-all through the NICs is a priced part, which DualPipe's
    # overlap hides behind the other micro-batch's compute (report §3.2.1)
    exposed = replace(traits, ep_comm_overlap=0.0)
    bare = estimate_plan(plan, cluster, runtime=exposed)
    assert bare.time["ep_comm"] > 0.1 * bare.step_time_s
    assert est.time["ep_comm"] < bare.time["ep_comm"]
    # one copy per destination node sends fewer bytes than one per expert
    per_expert = estimate_plan(plan, cluster, runtime=replace(exposed, ep_dispatcher="alltoall"))
    assert bare.time["ep_comm"] < 0.75 * per_expert.time["ep_comm"]
    # 112 of 132 SMs for the GEMMs: compute slower, but never by more than 132/112
    all_sms = estimate_plan(plan, cluster, runtime=replace(traits, comm_reserved_sms=0))
    assert all_sms.time["compute"] < est.time["compute"] <= all_sms.time["compute"] * 132 / 112
    # Megatron's alltoall dispatcher without overlap or FP8 dispatch exposes all of it
    plain = estimate_plan(deepseek_v3_plan("full", layers=ACCURACY.ONE_F_ONE_B_LAYERS), cluster,
                          runtime="megatron")
    assert plain.feasible and plain.time["ep_comm"] > 1.5 * bare.time["ep_comm"]


def test_all_to_all_overlap_hides_at_most_the_compute():
    m = PRESETS["mixtral-8x7b"]
    plan = _plan("mixtral-8x7b", 64, dp=8, tp=8, ep=8)
    base = load_runtime("megatron")
    exposed = {f: estimate_plan(plan, model=m, runtime=replace(base, ep_comm_overlap=f))
               for f in (0.0, 0.5, 1.0)}
    assert exposed[0.0].time["ep_comm"] > exposed[0.5].time["ep_comm"] \
        > exposed[1.0].time["ep_comm"] >= 0.0
    fp8 = estimate_plan(plan, model=m, runtime=replace(base, ep_dispatch_bytes=1.0))
    # two of the four all-to-alls at half the bytes: between half and all of the bf16 time
    assert 0.5 * exposed[0.0].time["ep_comm"] < fp8.time["ep_comm"] < exposed[0.0].time["ep_comm"]


def test_moe_accuracy_prints_the_practitioner_sets_moe_rows(capsys):
    runs = ACCURACY.practitioner_runs()
    ids = [r.name.split()[0] for r in runs]
    assert "mcore-mixtral-8x7b-64gpu-bf16" in ids and "modelzoo-mixtral-8x22b-128gpu-bf16" in ids
    assert any(i.startswith("mbridge-qwen3-30b") for i in ids)
    assert not any("llama" in i for i in ids)  # dense rows stay in benchmarks/practitioner.py
    assert all(r.published_step_s > 0 and r.source.startswith("https://") for r in runs)
    assert ACCURACY.main() == 0
    out = capsys.readouterr().out
    assert all(r.name in out for r in runs)


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
    assert float(moe.node_dedup_share(m, r, 8)[0]) == pytest.approx(want, rel=1e-12)
    assert float(moe.node_dedup_share(m, r, 8)[0]) == pytest.approx(0.4536, abs=1e-4)
    inside = _rows(_plan("qwen3-235b-a22b", 256, dp=128, tp=2, ep=8), m)
    assert float(moe.node_dedup_share(m, inside, 8)[0]) == 1.0  # EP 8 stays in one node
    # as many nodes as a token has experts (routing not node-limited): below one copy each
    ds = PRESETS["deepseek-v3"]
    ds = ds.replace(moe=replace(ds.moe, route_groups=1, route_groups_per_token=None))
    wide = _rows(_plan("deepseek-v3", 2048, "h800-sxm-80gb", gbs=15360, dp=128, pp=16, ep=64),
                 ds)
    assert 0.5 < float(moe.node_dedup_share(ds, wide, 8)[0]) < 1.0
    profile = load_profile("h100-sxm-80gb")
    plain = moe.all_to_all_per_block_s(m, profile, r)
    dedup = moe.all_to_all_per_block_s(m, profile, r, dedup_nodes=True)
    assert float(dedup[0]) < float(plain[0])
    same = moe.all_to_all_per_block_s(m, profile, inside, dedup_nodes=True)
    assert float(same[0]) == float(moe.all_to_all_per_block_s(m, profile, inside)[0])


def test_node_limited_routing_sends_to_fewer_nodes():
    """DeepSeek-V3: top-8 of 256 experts in 8 groups, 4 groups per token (node-limited)."""
    from math import comb

    ds = PRESETS["deepseek-v3"].moe
    assert (ds.route_groups, ds.route_groups_per_token) == (8, 4)
    free = replace(ds, route_groups=1, route_groups_per_token=None)
    # 8 nodes, one group each: a node's group is chosen with 4/8, then misses the 8 of 128
    q = comb(96, 8) / comb(128, 8)
    assert moe.distinct_nodes(ds, 8) == pytest.approx(8 * 0.5 * (1 - q), rel=1e-12)
    assert moe.distinct_nodes(free, 8) == pytest.approx(
        8 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)
    # 4 nodes of two groups: X of a node's 2 groups among the 4 chosen of 8
    p1, p2 = 2 * comb(6, 3) / comb(8, 4), comb(6, 2) / comb(8, 4)
    want = 4 * (p1 * (1 - q) + p2 * (1 - comb(64, 8) / comb(128, 8)))
    assert moe.distinct_nodes(ds, 4) == pytest.approx(want, rel=1e-12)
    # 16 nodes, each group over two: chosen with 4/8, then misses the node's 16 of 128
    assert moe.distinct_nodes(ds, 16) == pytest.approx(
        16 * 0.5 * (1 - comb(112, 8) / comb(128, 8)), rel=1e-12)
    assert moe.distinct_nodes(ds, 8) < moe.distinct_nodes(free, 8) <= 8
    assert moe.distinct_nodes(ds, 1) == 1.0


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
    share = float(moe.node_dedup_share(m, _rows(across, m), 8)[0])
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
    a2a = [float(moe.all_to_all_per_block_s(x, profile, r)[0]) for x, r in ((m, r2), (top4, r4))]
    gather = [float(moe.all_to_all_per_block_s(x, profile, r, all_gather=True)[0])
              for x, r in ((m, r2), (top4, r4))]
    assert gather[0] == gather[1] > 0.0
    assert a2a[1] > 1.5 * a2a[0]
    assert moe.busiest_factor(m) == 1.0
    assert m.moe.router_dtype == "fp32"
    assert 3.0 * a2a[0] < gather[0] < 6.0 * a2a[0]
    bf16_router = m.replace(moe=replace(m.moe, router_dtype="bf16"))
    bf16_gather = float(moe.all_gather_dispatch_s(bf16_router, profile, _rows(
        _plan("mixtral-8x7b", 8, dp=8, ep=8), bf16_router))[0])
    assert 2.0 * a2a[0] < bf16_gather < 4.0 * a2a[0]
    # no EP: the expert-TP gather is sequence parallelism's, priced with the TP collectives
    tp_only = _rows(_plan("mixtral-8x7b", 8, dp=4, tp=2), m)
    assert float(moe.all_gather_dispatch_s(m, profile, tp_only)[0]) == 0.0
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
    few, lots = (float(moe.all_gather_dispatch_s(x, profile, _rows(ep8, x))[0])
                 for x in (m, many))
    assert lots > few > 0.0
    etp_only = _plan("mixtral-8x7b", 8, dp=4, tp=2, etp=2)
    bf16_router = m.replace(moe=replace(m.moe, router_dtype="bf16"))
    fp32_s, bf16_s = (float(moe.all_gather_dispatch_s(x, profile, _rows(etp_only, x))[0])
                      for x in (m, bf16_router))
    assert fp32_s > bf16_s > 0.0
    # a recomputed block runs the forward's legs again: more than half the exchange, by the
    # routing map's gather, which has no backward
    forward = float(moe.all_gather_dispatch_s(m, profile, _rows(ep8, m), forward_only=True)[0])
    assert few / 2.0 < forward < few
    # the gather buffer follows the dispatcher's group (expert TP x EP), not the dense TP
    tp_only = _rows(_plan("mixtral-8x7b", 8, dp=4, tp=2), m)
    assert float(moe.all_gather_buffer_bytes(m, tp_only)[0]) == 0.0
    assert float(moe.all_gather_buffer_bytes(m, _rows(etp_only, m))[0]) == 4096 * 4096 * 2


def test_ep_dispatcher_is_checked_when_loaded(tmp_path):
    from autoplan.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: x\nep_dispatcher: deep-ep\n")
    with pytest.raises(ConfigError, match="ep_dispatcher"):
        load_runtime(str(bad))
    for field, value in (("ep_comm_overlap", 0.5), ("ep_dispatch_bytes", 1)):
        bad.write_text(f"schema_version: 1\nname: x\nbase: megatron-allgather\n"
                       f"{field}: {value}\n")
        with pytest.raises(ConfigError, match=f"runtime.{field}: got .*allgather"):
            load_runtime(str(bad))


def test_fp8_expert_casts_replace_the_dense_mlps():
    """fp8_cast_delta_bytes: one expert per token as wide as the dense MLP, evenly loaded, casts
    what the dense MLP casts (delta 0); top-k casts k copies of it (Mixtral: top-2, f_e = f)."""
    base = PRESETS["mixtral-8x7b"]
    one = base.replace(moe=replace(base.moe, experts_per_token=1, load_imbalance=1.0,
                                   expert_ffn_hidden_size=base.ffn, capacity_factor=None))
    r = _rows(_plan("mixtral-8x7b", 8, dp=8, ep=8), one)
    assert float(moe.fp8_cast_delta_bytes(one, r)[0]) == pytest.approx(0.0, abs=1e-6)
    two = one.replace(moe=replace(one.moe, experts_per_token=2))
    tokens, h, f = 4096.0, base.hidden_size, base.ffn  # mbs 1 at Mixtral's 4096 tokens
    want = 3.0 * tokens * (2.0 * h + 3.0 * f)  # a second copy of h + 3f inputs and gradients
    assert float(moe.fp8_cast_delta_bytes(two, _rows(_plan("mixtral-8x7b", 8, dp=8, ep=8),
                                                     two))[0]) == pytest.approx(want)
    # an fp8 dispatch casts fc1's input once per token, before the copies
    fp8_dispatch = moe.fp8_cast_delta_bytes(two, r, dispatch_bytes=1.0)
    assert float(fp8_dispatch[0]) == pytest.approx(want - 3.0 * tokens * h)


def test_expert_zero_traffic_follows_the_stage_and_shares_the_dense_overlap_window():
    """The routed experts' ZeRO collectives over the expert-DP group follow the dense stage:
    ZeRO-3 (FSDP2 in torchtitan, Megatron-FSDP in Megatron-Core) gathers them for every
    forward and backward like the blocks, Megatron's distributed optimizer (ZeRO-1) once per
    step; and both groups hide in the same compute, never more than the larger window."""
    from autoplan.cost import step_time
    from autoplan.cost.rows import rows_of
    from autoplan.cost.step_memory import held_expert_psi

    model = PRESETS["mixtral-8x7b"]
    prof = load_profile("h100-sxm-80gb")
    idle = {"forward": np.zeros(1), "backward": np.zeros(1), "recompute": np.zeros(1)}

    def traffic(runtime: str, gbs: int, zero: int = 3):
        rt = load_runtime(runtime)
        plan = replace(_plan("mixtral-8x7b", 16, gbs=gbs, dp=16, ep=4), zero_stage=zero)
        r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
        t = step_time._zero_traffic(prof, r, rt, idle, held_expert_psi(model, r, rt),
                                    r.expert_shard, r.ep * r.etp)
        return float(t.gathers[0]), float(r.m[0])

    for runtime in ("torchtitan", "megatron"):
        (g2, m2), (g8, m8) = traffic(runtime, 32), traffic(runtime, 128)
        assert (m2, m8) == (2.0, 8.0) and g8 == pytest.approx(g2 * m8 / m2)  # 2m a step
    (g2, _), (g8, _) = traffic("megatron", 32, zero=1), traffic("megatron", 128, zero=1)
    assert g8 == pytest.approx(g2)  # the distributed optimizer's one gather a step

    rt = load_runtime("torchtitan")
    plan = replace(_plan("mixtral-8x7b", 16, gbs=128, dp=16, ep=4), zero_stage=3)
    r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
    psi, psi_e = np.full(1, 1e9), held_expert_psi(model, r, rt)
    busy = {"forward": np.full(1, 0.05), "backward": np.full(1, 0.1),
            "recompute": np.zeros(1)}
    groups = [step_time._zero_traffic(prof, r, rt, busy, p, n, s) for p, n, s in (
        (psi, r.shard, r.tp), (psi_e, r.expert_shard, r.ep * r.etp))]
    total = sum(float(g.reductions[0] + g.gathers[0]) for g in groups)
    exposed = float(step_time._dp_comm(prof, r, rt, busy, psi, psi_e)[0])
    window = max(float(g.reduction_window[0]) for g in groups) + max(
        float(g.gather_window[0]) for g in groups)
    # what is hidden (all there is, less what is exposed net of contention and copies) never
    # exceeds one window of each kind: the two groups do not hide twice in the same compute
    assert total - exposed <= window * (1 + 1e-9)
    assert exposed > 0.0


def test_full_recompute_runs_the_dispatch_and_combine_again():
    """A recomputed whole block re-runs its forward, the MoE dispatch and combine included
    (half of a block's four exchanges), as selective recompute of the `moe` module does: ep_comm
    grows by half the block's exchange per recomputed MoE layer, and only with experts spread."""
    from autoplan.plan import Recompute, RecomputeModule, RecomputePolicy

    m = PRESETS["mixtral-8x7b"]
    base = _plan("mixtral-8x7b", 64, gbs=256, dp=16, pp=4, ep=8)
    ep = {name: estimate_plan(base.replace(recompute=rc), model=m, runtime="megatron"
                              ).time["ep_comm"]
          for name, rc in (("none", Recompute()),
                           ("full", Recompute(policy=RecomputePolicy.FULL)),
                           ("moe", Recompute(policy=RecomputePolicy.SELECTIVE,
                                             modules=(RecomputeModule.MOE,))))}
    assert ep["full"] == pytest.approx(1.5 * ep["none"], rel=1e-9)
    assert ep["full"] == pytest.approx(ep["moe"], rel=1e-9)
    dense_ep = _plan("mixtral-8x7b", 64, gbs=256, dp=64, pp=1)
    assert estimate_plan(dense_ep.replace(recompute=Recompute(policy=RecomputePolicy.FULL)),
                         model=m, runtime="megatron").time["ep_comm"] == 0.0
