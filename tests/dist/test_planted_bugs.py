"""PLANTED BUGS: the parity check must fail for each known parallelism bug (one at a time)."""

from __future__ import annotations

import pytest

from tests.dist.bugs import BUGS
from tests.dist.parity import compare, make_plan, reference_plan, run_parity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

PLANS = {
    # bug -> (plan that exercises the buggy piece, optimizer)
    "tp-missing-allreduce": (make_plan(tp=2), "sgd"),
    "dp-sum-not-average": (make_plan(dp=2, zero=2), "sgd"),
    "pp-drop-microbatch-grad": (make_plan(pp=2, mbs=2, gbs=8), "adamw"),
    "sp-wrong-gather": (make_plan(tp=2, sp=True), "sgd"),
    "zero-stale-grads": (make_plan(dp=2, zero=3), "sgd"),
    "pp-tied-no-grad-sync": (make_plan(model="tiny-tied", pp=2), "sgd"),
    "cp-kv-rank-order": (make_plan("tiny-llama", cp=2), "sgd"),
    "cp-position-off-by-one": (make_plan(cp=2), "sgd"),
    "hsdp-no-replicate-allreduce": (make_plan(dp=4, dp_shard=2, zero=3), "sgd"),
}


def test_every_bug_has_a_check():
    assert set(PLANS) | {"recompute-fresh-rng"} == set(BUGS)


@pytest.mark.parametrize("bug", list(PLANS))
def test_parity_catches_planted_bug(pool, reference_cache, bug):
    plan, optim = PLANS[bug]
    key = (str(plan.model), plan.batch, optim, 10, 0.0)
    if key not in reference_cache:
        reference_cache[key] = run_parity(pool, reference_plan(plan), 10, optim)
    clean = run_parity(pool, plan, 10, optim)
    assert not compare(clean, reference_cache[key]), "the plan must pass without the bug"
    buggy = run_parity(pool, plan, 10, optim, bug=bug, timeout_s=120)  # runs, but wrongly
    assert compare(buggy, reference_cache[key]), f"parity did not catch {bug}"


def test_recompute_rng_bug_breaks_bitwise_equality(pool):
    """With dropout, full recompute must equal no recompute bitwise; a recompute that draws
    fresh dropout masks must not."""
    base = make_plan(dp=2, zero=2)
    recomputed = make_plan(dp=2, zero=2, recompute="full")
    ref = run_parity(pool, base, 5, "sgd", capture=(1,), dropout=0.1)
    ok = run_parity(pool, recomputed, 5, "sgd", capture=(1,), dropout=0.1)
    assert ok["losses"] == ref["losses"]
    bad = run_parity(pool, recomputed, 5, "sgd", capture=(1,), dropout=0.1,
                     bug="recompute-fresh-rng")
    assert bad["losses"] != ref["losses"]
