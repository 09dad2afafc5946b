"""Validity rules: each one fires on the plan it is about, and only there."""

from __future__ import annotations

import pytest

from autoplan.hardware import cluster
from autoplan.model_spec import PRESETS
from autoplan.plan import plan_from_dict
from autoplan.plan_rules import RULE_KEYS, first_violation, validate_plan
from autoplan.plan_table import plan_to_row

BASE = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
        "parallel": {"dp": 8, "tp": 4, "pp": 2}, "zero_stage": 1,
        "batch": {"micro_batch_size": 2, "global_batch_size": 256}}
MODEL = PRESETS["llama-3-8b"]


def _reasons(**edits):
    data = {**BASE, **edits}
    plan = plan_from_dict(data)
    return validate_plan(plan, MODEL, cluster("h100-sxm-80gb", 64))


def test_base_plan_is_valid() -> None:
    assert _reasons() == []


@pytest.mark.parametrize(
    ("edits", "needle"),
    [
        ({"parallel": {"dp": 4, "tp": 4, "pp": 2}}, "cluster has 64 GPUs"),
        ({"parallel": {"dp": 4, "tp": 16, "pp": 1}}, "num_kv_heads=8"),
        ({"parallel": {"dp": 2, "tp": 1, "pp": 32}, "pipeline": {"vpp": 2,
          "schedule": "interleaved-1f1b"}}, "does not divide num_layers=32"),
        ({"batch": {"micro_batch_size": 3, "global_batch_size": 256}}, "not a multiple"),
        ({"batch": {"micro_batch_size": 32, "global_batch_size": 256}}, "micro-batches per step (1) >= pp=2"),
        ({"pipeline": {"vpp": 2}}, "vpp=2 needs pp > 1 and schedule"),
        ({"pipeline": {"schedule": "interleaved-1f1b"}}, "needs vpp >= 2"),
        ({"sequence_parallel": True, "parallel": {"dp": 32, "tp": 1, "pp": 2}}, "needs parallel.tp > 1"),
        ({"offload": {"params": True}}, "needs zero_stage=3"),
        ({"offload": {"optimizer": True}, "zero_stage": 0}, "needs zero_stage >= 1"),
        ({"recompute": {"policy": "full", "num_layers": 17}}, "recompute.num_layers=17 must "
         "be at most the blocks of the smallest pipeline stage (16: the runtime recomputes that "
         "many of every stage); lower it to 16 or less, or set it null"),
        ({"recompute": {"policy": "none", "num_layers": 2}}, "recompute.num_layers=2 needs a "
         "policy other than none; set recompute.policy (full or selective), or set it null"),
        ({"parallel": {"dp": 4, "tp": 4, "pp": 2, "cp": 2}, "model": "llama-3-8b",
          "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64}}, None),
        ({"pipeline": {"layers_per_stage": [10, 20]}}, "summing to 30"),
        ({"precision": "fp32"}, None),
        ({"pipeline": {"schedule": "zero-bubble"},
          "batch": {"micro_batch_size": 2, "global_batch_size": 48}}, "multiple of pp=2"),
        ({"pipeline": {"schedule": "zero-bubble"}, "recompute": {"policy": "selective"}},
         "selective recompute cannot follow"),
    ],
)
def test_each_rule_fires(edits: dict, needle: str | None) -> None:
    reasons = _reasons(**edits)
    if needle is None:
        assert reasons == []
    else:
        assert any(needle in r for r in reasons), reasons


def test_v100_has_no_bf16() -> None:
    plan = plan_from_dict({**BASE, "cluster": {"profile": "v100-sxm2-32gb", "num_gpus": 64}})
    reasons = validate_plan(plan, MODEL, cluster("v100-sxm2-32gb", 64))
    assert any("precision=bf16 is not supported" in r for r in reasons)


def test_first_violation_counts_by_rule() -> None:
    plan = plan_from_dict({**BASE, "sequence_parallel": True,
                           "parallel": {"dp": 32, "tp": 1, "pp": 2}})
    idx = first_violation(plan_to_row(plan, MODEL), MODEL)
    assert RULE_KEYS[int(idx[0])] == "sp-needs-tp"


def test_sequence_parallel_needs_tp_to_divide_the_sequence() -> None:
    model = PRESETS["tiny"].replace(seq_len=66)
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 4},
                           "parallel": {"tp": 4}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 4}})
    reasons = validate_plan(plan, model, cluster("cpu-gloo", 4))
    assert any("seq_len/cp = 66/1 = 66" in r for r in reasons), reasons


BROKEN = {  # plans that break rules, each named by a fragment of the rule's message
    "tp=3 does not divide num_heads=4": {"parallel": {"tp": 3}},
    "not divisible by 2*cp=6": {"parallel": {"cp": 3}},
    "micro-batches per step (1) >= pp=2": {"parallel": {"pp": 2}},
    "offload needs zero_stage >= 1": {"offload": {"optimizer": True}},
}


@pytest.mark.parametrize("needle", sorted(BROKEN))
def test_runtime_and_planner_judge_by_one_rule_set(needle: str) -> None:
    """The runtime's check is the planner's rule set: same problems, each said once."""
    from autoplan.errors import ConfigError
    from autoplan.runtime.validation import check_plan, runtime_problems

    edits = BROKEN[needle]
    par = {"tp": 1, "pp": 1, "cp": 1, **edits.get("parallel", {})}
    data = {"model": "tiny", "cluster": {"profile": "cpu-gloo",
                                         "num_gpus": par["tp"] * par["pp"] * par["cp"]},
            "batch": {"micro_batch_size": 1, "global_batch_size": 1}, **edits, "parallel": par}
    plan = plan_from_dict(data)
    model = PRESETS["tiny"]
    planner = validate_plan(plan, model, cluster("cpu-gloo", plan.world_size))
    assert runtime_problems(plan, model) == planner and any(needle in r for r in planner)
    with pytest.raises(ConfigError) as err:
        check_plan(plan, model, plan.world_size)
    for reason in planner:
        assert str(err.value).count(reason) == 1
    assert str(err.value).count("does not divide") <= sum("does not divide" in r
                                                          for r in planner)


def _named_stage(reasons: list[str]) -> int:
    import re

    found = [re.search(r"offload\.optimizer=true.*set zero_stage: (\d)", r) for r in reasons]
    stages = [int(f.group(1)) for f in found if f]
    assert len(stages) == 1, reasons
    return stages[0]


def test_offload_advice_names_a_stage_every_runtime_accepts() -> None:
    """Following the ZeRO-0 offload fix must not meet a runtime's own refusal (Megatron-Core
    offloads the optimizer at ZeRO-1 only; the fix once named 2)."""
    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import RUNTIMES, load_runtime

    stage = _named_stage(_reasons(offload={"optimizer": True}, zero_stage=0))
    fixed = plan_from_dict({**BASE, "offload": {"optimizer": True}, "zero_stage": stage})
    assert validate_plan(fixed, MODEL, cluster("h100-sxm-80gb", 64)) == []
    runs_it = [name for name in RUNTIMES if "optimizer" in load_runtime(name).offload]
    assert "megatron" in runs_it and "deepspeed" in runs_it
    for name in runs_it:
        assert not [r for r in refusals(fixed, load_runtime(name), MODEL) if "offload" in r], name


def test_offload_advice_with_params_offloaded_agrees_with_the_params_rule() -> None:
    reasons = _reasons(offload={"optimizer": True, "params": True}, zero_stage=0)
    assert any("offload.params=true needs zero_stage=3" in r for r in reasons)
    assert _named_stage(reasons) == 3
