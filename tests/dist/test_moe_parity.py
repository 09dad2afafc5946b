"""MOE PARITY: tiny-moe under expert parallelism matches one process (fp32 losses, gradients,
parameters within 1e-5), alone and with TP (experts folded over tp), PP, ZeRO-3 and
recompute (the slow tier adds CP, offload, other schedules, 8 ranks); planted
expert-parallel bugs fail the same check.

The rows run the token-index router (a fixed assignment by position, uneven across experts),
so no near-tie of router scores can send a token elsewhere under another layout; one row runs
the learned router. `-m slow` adds more compositions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autoplan.model_spec import ModelSpec, load_model
from tests.dist.bugs import MOE_BUGS
from tests.dist.parity import compare, make_plan, reference_plan, run_parity
from tests.dist.test_parity import ADAM_PARAM_ATOL

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def moe_plan(ep: int, model: Any = "tiny-moe", **kw):
    """A tiny-moe plan (or `model`'s) with expert parallelism `ep` (Parallel.ep)."""
    plan = make_plan(model, **kw)
    return dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, ep=ep))


def _dropping() -> ModelSpec:
    """tiny-moe with capacity factor 1.0: each expert keeps 16 of a 64-token sequence's 128
    slots, so the token-index router's uneven counts drop a few (runtime/models/moe.py)."""
    base = load_model("tiny-moe")
    assert base.moe is not None
    return base.replace(moe=dataclasses.replace(base.moe, capacity_factor=1.0))


DROPPING = _dropping()


C = dict
ROWS = {
    # 2 ranks: EP alone, the learned router, AdamW
    "ep2-dp2-learned-adamw": C(ep=2, dp=2, router="learned", optim="adamw"),
    # 4 ranks: ZeRO-3 with expert-DP 1 (ep = dp) and ZeRO-1 with expert-DP 2
    "ep4-dp4-zero3": C(ep=4, dp=4, zero=3, mbs=1),
    "ep2-dp4-zero1-selective": C(ep=2, dp=4, zero=1, mbs=1, recompute="selective"),
    # EP inside dp next to TP+SP; EP folded over the tp ranks (ep 4 on dp 2 x tp 2)
    "ep2-dp2tp2-sp": C(ep=2, dp=2, tp=2, sp=True),
    "ep4-dp2tp2-full": C(ep=4, dp=2, tp=2, recompute="full"),
    # the layout kinds of `autoplan search --model mixtral-8x7b ... --num-gpus 64`'s winner
    # (dp 32, pp 2, ep 8, ZeRO-1, zero-bubble V with vpp 2)
    "ep2-dp2pp2-zbv-zero1": C(ep=2, dp=2, pp=2, zero=1, schedule="zero-bubble", vpp=2, mbs=1),
    # token dropping (capacity factor 1.0) with the experts folded over tp
    "ep4-dp2tp2-sp-capacity": C(model=DROPPING, ep=4, dp=2, tp=2, sp=True),
}
SLOW_ROWS = {
    "ep2-dp2pp2-1f1b": C(ep=2, dp=2, pp=2),
    "ep2-dp2-sgd": C(ep=2, dp=2),
    "ep2-dp2-zero2-full": C(ep=2, dp=2, zero=2, recompute="full"),
    "ep2-dp2tp2-sp-zero3-selective": C(ep=2, dp=2, tp=2, sp=True, zero=3,
                                       recompute="selective"),
    "ep2-dp4-zero3": C(ep=2, dp=4, zero=3, mbs=1),
    "ep2-dp2tp2-zero3-sp-full": C(ep=2, dp=2, tp=2, zero=3, sp=True, recompute="full"),
    "ep8-dp4tp2-sp": C(ep=8, dp=4, tp=2, sp=True, mbs=1),
    "ep4-dp4pp2-gpipe-zero3": C(ep=4, dp=4, pp=2, zero=3, schedule="gpipe", mbs=1),
    "ep2-dp2pp2-interleaved": C(ep=2, dp=2, pp=2, schedule="interleaved-1f1b", vpp=2,
                                mbs=1),
    # ep folded over context-parallel ranks; ZeRO-3 with parameters offloaded to the host
    "ep2-cp2": C(ep=2, cp=2),
    "ep4-dp2cp2-zero3": C(ep=4, dp=2, cp=2, zero=3, mbs=1),
    "ep2-dp2-zero3-offload": C(ep=2, dp=2, zero=3, offload=True),
}


def _check(pool, reference_cache, row: dict, bug: str | None = None) -> list[str]:
    row = dict(row)
    optim, router = row.pop("optim", "sgd"), row.pop("router", "token-index")
    plan = moe_plan(**row)
    key = (plan.model, plan.batch, optim, 10, 0.0, router)
    if key not in reference_cache:
        reference_cache[key] = run_parity(pool, reference_plan(plan), 10, optim, router=router)
    run = run_parity(pool, plan, 10, optim, bug=bug, router=router)
    atol = ADAM_PARAM_ATOL if optim == "adamw" else 0.0
    return compare(run, reference_cache[key], param_atol=atol)


@pytest.mark.parametrize("name", list(ROWS))
def test_expert_parallel_matches_single_process(pool, reference_cache, name):
    problems = _check(pool, reference_cache, ROWS[name])
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_ROWS))
def test_expert_parallel_compositions_match_single_process(pool, reference_cache, name):
    problems = _check(pool, reference_cache, SLOW_ROWS[name])
    assert not problems, "\n".join(problems[:20])


BUG_ROWS = {
    "ep-no-regroup": C(ep=2, dp=2),
    "ep-expert-grads-over-edp": C(ep=2, dp=2),
    "moe-capacity-keeps-lowest-gates": C(model=DROPPING, ep=2, dp=2),
}


def test_every_moe_bug_has_a_check():
    assert set(BUG_ROWS) == set(MOE_BUGS)


@pytest.mark.parametrize("bug", list(BUG_ROWS))
def test_parity_catches_planted_expert_parallel_bug(pool, reference_cache, bug):
    clean_key = ("moe-clean", str(BUG_ROWS[bug]))
    if clean_key not in reference_cache:
        reference_cache[clean_key] = _check(pool, reference_cache, BUG_ROWS[bug])
    assert not reference_cache[clean_key], "the plan must pass without the bug"
    problems = _check(pool, reference_cache, BUG_ROWS[bug], bug=bug)
    assert problems, f"parity did not catch {bug}"
