"""The exhaustive search against a brute force that shares none of its enumeration: every plan
of a small space built as a Plan, judged by validate_plan and scored by estimate_plan."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import load_model
from autoplan.plan import (
    Attention,
    Batch,
    ClusterRef,
    Offload,
    Parallel,
    Pipeline,
    Plan,
    Precision,
    Recompute,
    RecomputePolicy,
    Schedule,
)
from autoplan.plan_rules import validate_plan
from autoplan.search.engine import run_search
from autoplan.search.output import plans
from autoplan.search.targets import Targets
from tests.search.conftest import SMALL_SPACE, request


def brute_force(gpus: int, gbs: int) -> list[tuple[Plan, object]]:
    """(plan, estimate) of every rule-valid plan of SMALL_SPACE, by plain loops."""
    model, cluster = load_model("tiny"), ClusterSpec(load_profile("cpu-gloo"), gpus)
    s = SMALL_SPACE
    out = []
    degrees = [1, 2, 4]
    for dp, tp, pp in itertools.product(degrees, s["parallel"]["tp"], s["parallel"]["pp"]):
        if dp * tp * pp != gpus:
            continue
        for sp, sched, vpp, zero, policy, nl, mbs, attn in itertools.product(
                s["sequence_parallel"], s["pipeline"]["schedule"], s["pipeline"]["vpp"],
                s["zero_stage"], s["recompute"]["policy"], s["recompute"]["num_layers"],
                s["micro_batch_size"], s["attention"]):
            if policy == "none" and nl is not None:
                continue
            plan = Plan(
                model="tiny", cluster=ClusterRef("cpu-gloo", gpus), batch=Batch(mbs, gbs),
                parallel=Parallel(dp=dp, tp=tp, pp=pp), sequence_parallel=sp,
                pipeline=Pipeline(Schedule(sched), vpp), zero_stage=zero, offload=Offload(),
                recompute=Recompute(RecomputePolicy(policy), nl), precision=Precision.FP32,
                attention=Attention(attn))
            if validate_plan(plan, model, cluster):
                continue
            out.append((plan, estimate_plan(plan, cluster, model)))
    return out


@pytest.fixture(scope="module")
def brute() -> list[tuple[Plan, object]]:
    return brute_force(4, 8)


@pytest.fixture(scope="module")
def result():
    return run_search(request(sampler="exhaustive"))


def test_counts_add_up_to_every_candidate(result) -> None:
    counts = result.scored.counts
    assert sum(counts.values()) == result.total
    assert result.total == result.request.space.size()
    assert counts["feasible"] == int(result.scored.feasible.sum()) == len(result.order)


def test_rule_valid_candidates_match_brute_force(result, brute) -> None:
    c = result.scored.counts
    assert result.scored.n + c["duplicate"] + c["precision-unsupported"] == len(brute)


def test_winner_is_the_brute_force_optimum(result, brute) -> None:
    feasible = [e.tokens_per_s for _, e in brute if e.feasible]
    assert feasible, "the test space should have feasible plans"
    winner = plans(result, result.order[:1])[0]
    est = estimate_plan(winner)
    assert est.feasible
    assert est.tokens_per_s == pytest.approx(max(feasible), rel=1e-9)
    assert result.scored.cols["tokens_per_s"][result.best] == pytest.approx(max(feasible),
                                                                            rel=1e-9)


def test_latency_winner_matches_brute_force(brute) -> None:
    res = run_search(request(sampler="exhaustive", targets=Targets(("latency",))))
    best = min(e.step_time_s for _, e in brute if e.feasible)
    assert res.scored.cols["time_step"][res.best] == pytest.approx(best, rel=1e-9)


def test_ranking_is_sorted_and_tie_broken_by_memory(result) -> None:
    c = result.scored.cols
    tps = c["tokens_per_s"][result.order]
    assert np.all(np.diff(tps) <= 1e-9 * tps[:-1])
    ties = np.flatnonzero(np.diff(tps) == 0)
    mem = c["mem_total"][result.order]
    assert np.all(mem[ties] <= mem[ties + 1])


def test_targets_filter_and_count(brute) -> None:
    fastest = max(e.tokens_per_s for _, e in brute if e.feasible)
    res = run_search(request(sampler="exhaustive",
                             targets=Targets(min_tokens_per_s=fastest * 0.9)))
    expect = sum(1 for _, e in brute if e.feasible and e.tokens_per_s >= fastest * 0.9)
    dupes = res.scored.counts["duplicate"]
    assert 1 <= res.scored.counts["feasible"] <= expect
    assert res.scored.counts["feasible"] + dupes >= expect  # duplicates are the only gap
    assert res.scored.counts["tokens-per-s"] > 0


def test_nothing_feasible_gives_nearest_with_shortfall() -> None:
    res = run_search(request(model="gpt3-13b", gpus=(4,), gbs=8, sampler="exhaustive"))
    assert res.best is None and res.nearest is not None
    assert res.scored.counts["out-of-memory"] > 0
    near = res.scored.cols["mem_total"][res.nearest]
    valid = res.scored.cols["mem_total"]
    assert near == valid.min()


def test_gpu_count_range_is_searched(brute) -> None:
    res = run_search(request(gpus=(1, 2, 4, 8), sampler="exhaustive",
                             targets=Targets(("cost",))))
    assert set(np.unique(res.scored.cols["num_gpus"])) <= {1, 2, 4, 8}
    assert res.best is not None


def test_smallest_cluster_that_meets_a_target() -> None:
    gpus = (1, 2, 4, 8)
    full = run_search(request(gpus=gpus, sampler="exhaustive"))
    c = full.scored.cols
    feas = full.scored.feasible
    best_at = {n: c["tokens_per_s"][feas & (c["num_gpus"] == n)].max() for n in gpus}
    # a target the smallest count cannot reach: the answer is the smallest count that can
    target = best_at[1] * 1.01
    reach = [n for n in gpus if best_at[n] >= target]
    assert reach, "the test needs a count faster than 1 GPU"
    res = run_search(request(gpus=gpus, sampler="exhaustive",
                             targets=Targets(("gpus",), min_tokens_per_s=target)))
    assert res.scored.cols["num_gpus"][res.best] == min(reach)
    assert res.scored.cols["tokens_per_s"][res.best] == pytest.approx(best_at[min(reach)])
