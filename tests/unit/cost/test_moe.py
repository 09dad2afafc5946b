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
    from autoplan.cost import dp_comm
    from autoplan.cost.rows import rows_of
    from autoplan.cost.step_memory import held_expert_psi

    model = PRESETS["mixtral-8x7b"]
    prof = load_profile("h100-sxm-80gb")
    idle = {"forward": np.zeros(1), "backward": np.zeros(1), "recompute": np.zeros(1)}

    def traffic(runtime: str, gbs: int, zero: int = 3):
        rt = load_runtime(runtime)
        plan = replace(_plan("mixtral-8x7b", 16, gbs=gbs, dp=16, ep=4), zero_stage=zero)
        r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
        t = dp_comm._zero_traffic(prof, r, rt, idle, held_expert_psi(model, r, rt),
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
    groups = [dp_comm._zero_traffic(prof, r, rt, busy, p, n, s) for p, n, s in (
        (psi, r.shard, r.tp), (psi_e, r.expert_shard, r.ep * r.etp))]
    total = sum(float(g.reductions[0] + g.gathers[0]) for g in groups)
    exposed = float(dp_comm._dp_comm(prof, r, rt, busy, psi, psi_e)[0])
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
