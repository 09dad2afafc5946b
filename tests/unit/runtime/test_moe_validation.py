"""autoplan train refuses, in one line each, the MoE plans its runtime cannot run; the planner's
rules still accept them (Megatron-LM runs them). Expert tensor parallelism (etp > 1) runs."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.errors import ConfigError
from autoplan.model_spec import load_model
from autoplan.moe_spec import MoESpec
from autoplan.plan_rules import runtime_limits, validate_plan
from autoplan.plan_rules_runtime import RUNTIME_RULE_KEYS
from autoplan.runtime.validation import check_plan
from tests.dist.parity import make_plan


def _plan(ep=1, etp=1, **kw):
    plan = make_plan("tiny-moe", **kw)
    return dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, ep=ep, etp=etp))


def test_a_runnable_ep_plan_passes():
    spec = load_model("tiny-moe")
    for plan in (_plan(ep=2, dp=2), _plan(ep=4, dp=2, tp=2, sp=True), _plan(ep=8, dp=8, mbs=1),
                 _plan(ep=2, dp=2, recompute="selective"), _plan(ep=2, etp=2, dp=2, tp=2),
                 _plan(etp=2, dp=2), _plan(ep=2, etp=4, dp=8, mbs=1)):
        check_plan(plan, spec, plan.world_size)


@pytest.mark.parametrize("key,plan,spec,words", [
    ("runtime-moe-capacity", _plan(ep=2, cp=2), MoESpec(8, 2, 128, capacity_factor=1.25),
     "model.moe.capacity_factor=1.25 with parallel.cp=2"),
    ("runtime-moe-groups-softmax", _plan(ep=2, dp=2),
     MoESpec(8, 2, 128, route_groups=4, route_groups_per_token=2),
     "model.moe.route_groups=4 with router_aux_free=false"),
    ("runtime-ep-tp-tokens", _plan(ep=2, dp=1, tp=2, mbs=1, gbs=2), None, "divisible by tp"),
    ("runtime-ep-tp-tokens", _plan(etp=2, tp=2, mbs=1, gbs=2), None, "etp=2 with tp=2"),
    ("runtime-hsdp-ep", _plan(ep=2, dp=4, dp_shard=2, zero=2, mbs=1), None,
     "parallel.dp_shard=2"),
])
def test_runtime_refuses_what_it_cannot_run_in_one_line(key, plan, spec, words):
    spec = load_model("tiny-moe") if spec is None else load_model("tiny-moe").replace(moe=spec)
    if key == "runtime-ep-tp-tokens":  # with ep or etp > 1 the tp ranks split the tokens
        spec = spec.replace(seq_len=63)  # 63 tokens do not split over tp 2
    assert not validate_plan(plan, spec, None)  # the planner's rules accept it
    limits = runtime_limits(plan, spec)
    assert len(limits) == 1 and words in limits[0]
    with pytest.raises(ConfigError) as err:
        check_plan(plan, spec, plan.world_size)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_etp_is_no_longer_refused():
    assert "runtime-etp" not in RUNTIME_RULE_KEYS


def test_deepseek_v3_router_is_no_longer_refused():
    """router_aux_free runs (models/aux_free.py): deepseek-v3's EP plan and its tiny model."""
    assert "runtime-moe-aux-free" not in RUNTIME_RULE_KEYS
    for name in ("deepseek-v3", "tiny-deepseek"):
        spec = load_model(name).replace(mtp_layers=0)  # MTP has its own refusal, runtime-mtp
        assert spec.moe.router_aux_free and spec.moe.route_groups > 1
        assert not runtime_limits(_plan(ep=2, dp=2), spec)


def test_every_moe_runtime_rule_is_tested():
    """The MoE rules of RUNTIME_RULES, each refused above (the others have their own tests)."""
    assert set(RUNTIME_RULE_KEYS) >= {"runtime-moe-capacity",
                                      "runtime-moe-groups-softmax",
                                      "runtime-ep-tp-tokens", "runtime-hsdp-ep"}
