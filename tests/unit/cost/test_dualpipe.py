"""DualPipe as DeepSeek-V3's report (arXiv 2412.19437 §3.2.1, Table 2) and its reference
implementation (github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py) describe it: the bubble
with the weight-gradient time the block model has, the one-stage case, the schedule's
preconditions, and the pair's activations and parameters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost import pipeline, runtime_rules, stage_time, step_memory, step_time
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Schedule
from autoplan.plan_table import plan_to_row

DUAL = replace(load_runtime("megatron"), dualpipe=True)
LLAMA = PRESETS["llama-3-70b"]


def _plan(pp: int = 8, gbs: int = 64, vpp: int = 1, layers: tuple[int, ...] | None = None,
          dp: int = 1) -> Plan:
    sched = Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B
    return Plan(model="llama-3-70b", cluster=ClusterRef("h100-sxm-80gb", 8 * pp * dp),
                parallel=Parallel(dp=dp, tp=8, pp=pp), sequence_parallel=True,
                pipeline=Pipeline(schedule=sched, vpp=vpp, layers_per_stage=layers),
                batch=Batch(micro_batch_size=1, global_batch_size=gbs), zero_stage=1)


def _crit(plan: Plan, traits=DUAL) -> dict[str, np.ndarray]:
    r = rows_of(plan_to_row(plan, LLAMA), LLAMA, "bf16", traits)
    parts = step_memory.activation_parts(LLAMA, r, False, traits, "bf16")
    prof = step_time.priced_profile(load_profile("h100-sxm-80gb"), traits)
    return stage_time.critical_stage_s(LLAMA, prof, r, "bf16", False, traits, parts)


def test_bubble_is_table_2s_with_the_blocks_weight_gradient_time():
    """(pp/2 - 1)(F&B + B - 3W) with F&B = F + B: for F = 1, B = 2, W = 0.5 on 8 ranks
    3 * (1 + 4 - 1.5) = 10.5 (W = B/2 would give 6); none without a pipeline."""
    r = rows_of(plan_to_row(_plan(), LLAMA), LLAMA, "bf16", DUAL)
    crit = {"forward": np.array([1.0]), "backward": np.array([2.0]), "t_mb": np.array([3.0]),
            "wgrad": np.array([0.5])}
    assert float(step_time.dualpipe_bubble_s(r, crit)[0]) == pytest.approx(10.5)
    assert float(step_time.dualpipe_bubble_s(replace(r, pp=np.array([1.0])), crit)[0]) == 0.0
    # the schedule's own quantities live with the other schedules' (cost/pipeline.py)
    assert float(pipeline.dualpipe_bubble_s(np.array(8.0), 1.0, 2.0, 0.5)) == pytest.approx(10.5)
    assert [float(x) for x in pipeline.dualpipe_in_flight(np.array(8.0))] == [8.0, 1.0, 9.0]
    # a block's backward holds the attention core's backward and element-wise work besides
    # the weight gradients, which are the forward GEMMs' time: W < B/2, not B/2
    crit = _crit(_plan())
    assert 0.0 < float(crit["wgrad"][0]) < 0.5 * float(crit["backward"][0])
    one = estimate_plan(_plan(), runtime="megatron")
    dual = estimate_plan(_plan(), runtime=DUAL)
    assert 0.0 < dual.time["pp_bubble"] < 0.5 * one.time["pp_bubble"]
    # the paired end stages run at their mean: never slower than 1F1B's slowest stage
    assert dual.time["compute"] <= one.time["compute"]


def test_one_stage_runs_as_it_is():
    """Without a pipeline DualPipe has nothing to pair: the step is 1F1B's (the output head's
    time was halved by averaging the one stage with an empty 'last' one)."""
    plan = _plan(pp=1, dp=8)
    a = estimate_plan(plan, runtime=DUAL)
    b = estimate_plan(plan, runtime="megatron")
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.time["compute"] == pytest.approx(b.time["compute"], rel=1e-12)


@pytest.mark.parametrize(("plan", "names"), [
    (_plan(pp=3, gbs=60, layers=(27, 27, 26)), "pp=3"),   # odd rank count
    (_plan(pp=4, vpp=2), "vpp=2"),                         # two chunks per rank
    (_plan(pp=4, gbs=9), "9 micro-batches"),              # odd micro-batch count
    (_plan(pp=8, gbs=14), "14 micro-batches"),            # fewer than 2 x pp
])
def test_dualpipes_preconditions_are_refused_and_masked(plan, names):
    """DualPipe's step() asserts num_ranks % 2 == 0, num_chunks % 2 == 0 and num_chunks >=
    2 * num_ranks, and pairs one chunk per stage: estimate names the rule, the search masks
    it; the same plans are fine without DualPipe, and a plan that keeps them is too."""
    said = [s for s in runtime_rules.refusals(plan, DUAL) if "DualPipe" in s]
    assert len(said) == 1 and names in said[0]
    row = plan_to_row(plan, LLAMA)
    assert bool(runtime_rules.lacking(row, DUAL, LLAMA)[0])
    assert not any("DualPipe" in s for s in runtime_rules.refusals(plan, load_runtime(
        "megatron")))
    ok = _plan(pp=8, gbs=16)
    assert not runtime_rules.refusals(ok, DUAL)
    assert not bool(runtime_rules.lacking(plan_to_row(ok, LLAMA), DUAL, LLAMA)[0])


def test_deepseek_traits_run_one_chunk_per_stage():
    from tests.unit.cost.test_moe import DEEPSEEK_RUNTIME

    assert load_runtime(str(DEEPSEEK_RUNTIME)).schedules == ("1f1b",)


def test_end_rank_holds_pp_of_the_first_stage_and_one_of_the_last():
    """dualpipe.py step(): rank i peaks at pp - i micro-batches of stage i and i + 1 of stage
    pp-1-i, so rank 0 holds pp of the first stage and one of the last (not pp + 1 of their
    mean), a middle rank pp + 1 of its two."""
    r = rows_of(plan_to_row(_plan(), LLAMA), LLAMA, "bf16", DUAL)
    one = np.ones(1)
    states = ({"params": one}, {"params": 2 * one}, {"params": 4 * one})
    acts = step_memory.StageActivations(
        first=one, last=one, mid=one, of_layers=lambda layers: 100.0 * layers,
        working=0.5 * one, logits=0.25 * one, ends=(1.0 * one, 10.0 * one))
    out = step_memory._dualpipe_ranks(r, states, acts)
    pair, _, twice, act_pair, _, act_two = out
    assert float(pair["params"][0]) == 3.0 and float(twice["params"][0]) == 8.0
    assert float(act_pair[0]) == pytest.approx(8 * 1.0 + 10.0 + 0.5 + 0.25)
    assert float(act_two[0]) == pytest.approx(9 * 100.0 * float(r.layers_max[0]) + 0.5)
    # on 2 ranks (both end ranks, no middle one) a rank holds 2 micro-batches of the first
    # stage and one of the last: 2 x 50 + 30 blocks against 2 x 30 + 50, where the mean of
    # the two made them equal (and a middle rank that does not exist held 3 x 50)
    heavy_first = estimate_plan(_plan(pp=2, layers=(50, 30)), runtime=DUAL)
    heavy_last = estimate_plan(_plan(pp=2, layers=(30, 50)), runtime=DUAL)
    assert heavy_first.memory["activations"] == pytest.approx(
        130 / 110 * heavy_last.memory["activations"], rel=0.03)
    # time runs at the pair's mean and the pair holds the same parameters either way
    assert heavy_first.step_time_s == pytest.approx(heavy_last.step_time_s, rel=1e-6)
    assert heavy_first.memory["params"] == pytest.approx(heavy_last.memory["params"], rel=1e-9)


def test_a_rank_reduces_and_steps_both_of_its_stages():
    """Memory holds two stages' states on a DualPipe rank; the optimizer step and the
    data-parallel collectives price the same parameters (were one stage's)."""
    plan = _plan(dp=2)
    one = estimate_plan(plan, runtime="megatron")
    dual = estimate_plan(plan, runtime=DUAL)
    assert dual.time["optimizer"] > 1.8 * one.time["optimizer"]
    assert dual.time["dp_comm"] > one.time["dp_comm"]


def test_deepseek_experts_are_stepped_for_both_stages():
    """The MoE experts too: DeepSeek-V3's pair holds 8 blocks' experts (2 x 4)."""
    from tests.unit.cost.test_moe import ACCURACY, DEEPSEEK_RUNTIME, deepseek_v3_plan

    cluster = ClusterSpec(load_profile("h800-sxm-80gb"), 2048)
    dual = estimate_plan(deepseek_v3_plan(), cluster, runtime=str(DEEPSEEK_RUNTIME))
    one = estimate_plan(deepseek_v3_plan(), cluster, runtime=ACCURACY.one_f_one_b_runtime())
    assert dual.time["optimizer"] > 1.8 * one.time["optimizer"]


def test_a_rank_sums_its_pairs_norm_gradients_and_tied_head_itself():
    """Rank 0 holds the first and the last stage: sequence parallelism's once-per-step norm
    gradient sums cover both stages' blocks and the final norm, and a tied head's two copies
    sit on it, so no first-to-last all-reduce is sent (step_time.pipeline_comm_s)."""
    crit = _crit(_plan())
    one = _crit(_plan(), load_runtime("megatron"))
    assert float(crit["layers"][0]) == pytest.approx(2 * float(one["layers"][0]))
    assert float(crit["holds_head"][0]) == 1.0
    tied = LLAMA.replace(tie_embeddings=True)
    prof = load_profile("h100-sxm-80gb")

    def p2p(model, traits):
        r = rows_of(plan_to_row(_plan(), model), model, "bf16", traits)
        return float(step_time.pipeline_comm_s(model, prof, r, traits)[0])

    megatron = load_runtime("megatron")
    assert p2p(tied, megatron) > p2p(LLAMA, megatron)  # 1F1B sums the copies across ranks
    assert p2p(tied, DUAL) == pytest.approx(p2p(LLAMA, DUAL))
