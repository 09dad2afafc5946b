"""MOE PARITY: tiny-moe under expert parallelism matches one process (fp32 losses, gradients,
parameters within 1e-5), alone and with TP (experts folded over tp), PP, ZeRO-3 and
recompute (the slow tier adds CP, offload, other schedules, 8 ranks), and with expert tensor
parallelism (etp: each expert's FFN split, Megatron-Core's folding); planted expert-parallel
bugs fail the same check.

The rows run the token-index router (a fixed assignment by position, uneven across experts),
so no near-tie of router scores can send a token elsewhere under another layout; one row runs
the learned router. `-m slow` adds more compositions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autoplan.model_spec import MlpKind, ModelSpec, load_model
from tests.dist.bugs import MOE_BUGS
from tests.dist.parity import compare, make_plan, reference_plan, run_parity
from tests.dist.test_parity import ADAM_PARAM_ATOL

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def moe_plan(ep: int = 1, model: Any = "tiny-moe", etp: int = 1, **kw):
    """A tiny-moe plan (or `model`'s) with expert parallelism `ep` and expert tensor
    parallelism `etp` (Parallel.ep, .etp)."""
    plan = make_plan(model, **kw)
    return dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, ep=ep,
                                                                  etp=etp))


def _dropping() -> ModelSpec:
    """tiny-moe with capacity factor 1.0: each expert keeps 16 of a 64-token sequence's 128
    slots, so the token-index router's uneven counts drop a few (runtime/models/moe.py)."""
    base = load_model("tiny-moe")
    assert base.moe is not None
    return base.replace(moe=dataclasses.replace(base.moe, capacity_factor=1.0))


DROPPING = _dropping()
BIASED = load_model("tiny-moe").replace(name="tiny-moe-gelu-bias", mlp=MlpKind.GELU, bias=True)
"""tiny-moe with GELU experts and biases: under etp w1's bias is split with its rows, w2's is
replicated and added once (expert_parallel.PartialBias)."""


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
    # ETP: ep 2 x etp 2 on dp 2 x tp 2 (the etp groups are the tp groups), gradient clipping
    # at 0.1 so that every update scales with 1 / the gradient norm; etp over the dp ranks
    # with ZeRO-3 and biased GELU experts. 4 steps: CI's time.
    "ep2-etp2-dp2tp2-sp-clip": C(ep=2, etp=2, dp=2, tp=2, sp=True, clip=0.1, steps=4),
    "etp2-dp2-zero3-bias": C(model=BIASED, etp=2, dp=2, zero=3, steps=4),
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
    "ep2-etp2-dp4": C(ep=2, etp=2, dp=4, mbs=1),
    "etp2-dp4-zero3-bias": C(model=BIASED, etp=2, dp=4, zero=3, mbs=1),  # expert-DP 2
    "ep2-etp2-dp2pp2-zero1": C(ep=2, etp=2, dp=2, pp=2, tp=2, sp=True, zero=1, mbs=1),
    "etp2-dp2tp2-zero3-selective": C(model=BIASED, etp=2, dp=2, tp=2, sp=True, zero=3,
                                     recompute="selective"),
}


def _check(pool, reference_cache, row: dict, bug: str | None = None) -> list[str]:
    """Mismatches of `row` (with `bug` planted) against one process; a clean row's result is
    kept, so the planted-bug test does not rerun it."""
    clean = ("moe-clean", str(row))
    if bug is None and clean in reference_cache:
        return reference_cache[clean]
    row = dict(row)
    optim, router = row.pop("optim", "sgd"), row.pop("router", "token-index")
    steps, clip = row.pop("steps", 10), row.pop("clip", 0.0)
    plan = moe_plan(**row)
    key = (plan.model, plan.batch, optim, steps, clip, router)
    capture = (1, steps)
    if key not in reference_cache:
        reference_cache[key] = run_parity(pool, reference_plan(plan), steps, optim, capture,
                                          clip=clip, router=router)
    run = run_parity(pool, plan, steps, optim, capture, bug=bug, clip=clip, router=router)
    atol = ADAM_PARAM_ATOL if optim == "adamw" else 0.0
    problems = compare(run, reference_cache[key], param_atol=atol)
    if bug is None:
        reference_cache[clean] = problems
    return problems


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
    "etp-partials-not-summed": ROWS["etp2-dp2-zero3-bias"],
    "etp-bias-grad-not-summed": ROWS["etp2-dp2-zero3-bias"],
}


def test_every_moe_bug_has_a_check():
    assert set(BUG_ROWS) == set(MOE_BUGS)


@pytest.mark.parametrize("bug", list(BUG_ROWS))
def test_parity_catches_planted_expert_parallel_bug(pool, reference_cache, bug):
    assert not _check(pool, reference_cache, BUG_ROWS[bug]), "the plan must pass without the bug"
    problems = _check(pool, reference_cache, BUG_ROWS[bug], bug=bug)
    assert problems, f"parity did not catch {bug}"


def test_bf16_expert_parallel_trains_close_to_fp32(pool):
    """bf16 compute with fp32 master weights and reductions (FSDP2's MixedPrecisionPolicy) under
    expert parallelism, the precision every MoE winner trains in on a CPU
    (tests/dist/test_moe_cli.py): EP alone and folded over tp with sp, learned router, stays
    within 2% of the fp32 single-process losses, as the dense layouts do
    (tests/dist/test_parity.py)."""
    ref = run_parity(pool, moe_plan(), 5, "adamw", capture=(), router="learned")
    for plan in (moe_plan(ep=2, dp=2, precision="bf16"),
                 moe_plan(ep=4, dp=2, tp=2, sp=True, zero=1, precision="bf16")):
        got = run_parity(pool, plan, 5, "adamw", capture=(), router="learned")
        assert len(got["losses"]) == len(ref["losses"]) == 5
        assert got["losses"] != ref["losses"]  # bf16 ran: its round-off shows in the losses
        for a, b in zip(got["losses"], ref["losses"], strict=True):
            assert a == pytest.approx(b, rel=2e-2), plan.parallel
