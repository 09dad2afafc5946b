"""Plan fields parallel.dp_shard (HSDP) and grad_reduce_dtype: old plans load and save as
before, new ones round-trip, and the rules refuse what cannot run with the field and a fix."""

from __future__ import annotations

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.model_spec import load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision, ReduceDtype, plan_from_dict
from autoplan.plan_files import load_plan, save_plan
from autoplan.plan_rules import runtime_limits, validate_plan

TINY = load_model("tiny")


def _plan(**kw) -> Plan:
    kw.setdefault("parallel", Parallel(dp=4))
    return Plan(model="tiny", cluster=ClusterRef("cpu-gloo", 4), batch=Batch(1, 8), **kw)


def test_a_plan_without_the_fields_saves_without_them(tmp_path):
    path = save_plan(_plan(zero_stage=1), tmp_path / "old.yaml")
    data = yaml.safe_load(path.read_text())
    assert "dp_shard" not in data["parallel"] and "grad_reduce_dtype" not in data
    assert load_plan(path) == _plan(zero_stage=1)


def test_the_fields_round_trip(tmp_path):
    plan = _plan(parallel=Parallel(dp=4, dp_shard=2), zero_stage=3,
                 grad_reduce_dtype=ReduceDtype.BF16)
    path = save_plan(plan, tmp_path / "new.yaml")
    data = yaml.safe_load(path.read_text())
    assert data["parallel"]["dp_shard"] == 2 and data["grad_reduce_dtype"] == "bf16"
    assert load_plan(path) == plan
    assert plan.parallel.shard_degree == 2 and plan.parallel.replicate_degree == 2
    assert not validate_plan(plan, TINY) and not runtime_limits(plan, TINY)


@pytest.mark.parametrize(("changes", "says"), [
    (dict(parallel=Parallel(dp=4, dp_shard=3), zero_stage=2), "parallel.dp_shard=3 must be a "
     "divisor of dp=4 below it"),
    (dict(parallel=Parallel(dp=4, dp_shard=4), zero_stage=2), "or null (shard over all of dp)"),
    (dict(parallel=Parallel(dp=4, dp_shard=2), zero_stage=0), "needs zero_stage >= 1"),
    (dict(precision=Precision.FP32, grad_reduce_dtype=ReduceDtype.BF16),
     "grad_reduce_dtype=bf16 needs precision bf16 or fp8, got precision=fp32"),
    (dict(precision=Precision.FP16, grad_reduce_dtype=ReduceDtype.BF16), "precision=fp16"),
])
def test_rules_name_the_field_and_the_fix(changes, says):
    reasons = validate_plan(_plan(**changes), TINY)
    assert any(says in r for r in reasons), reasons


def test_fp32_reduce_fits_every_precision():
    for precision in (Precision.FP32, Precision.FP16, Precision.BF16):
        assert not validate_plan(_plan(precision=precision, grad_reduce_dtype=ReduceDtype.FP32),
                                 TINY)


def test_bad_values_are_one_line_config_errors():
    base = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 4},
            "batch": {"micro_batch_size": 1, "global_batch_size": 8}}
    with pytest.raises(ConfigError, match="parallel.dp_shard"):
        plan_from_dict({**base, "parallel": {"dp": 4, "dp_shard": 0}})
    with pytest.raises(ConfigError, match="grad_reduce_dtype"):
        plan_from_dict({**base, "grad_reduce_dtype": "fp16"})


@pytest.mark.parametrize(("dp", "shard", "says"), [
    (4, 4, "choose from 1, 2 or null (shard over all of dp)"),
    (8, 3, "choose from 1, 2, 4 or null"),
    (1, 1, "below it (HSDP: dp / dp_shard replicas of each shard group); choose null"),
])
def test_the_dp_shard_fix_lists_only_values_the_rule_takes(dp, shard, says):
    """It listed dp itself ("choose from 1, 2, 4 or null" for dp=4), which the rule refuses."""
    reasons = validate_plan(_plan(parallel=Parallel(dp=dp, dp_shard=shard), zero_stage=3),
                            TINY)
    assert any(says in r for r in reasons), reasons
