"""Plan schema: strict loading, saving that reloads equal, never overwriting."""

from __future__ import annotations

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.plan import Plan, plan_from_dict
from autoplan.plan_files import load_plan, plan_to_dict, save_plan

GOOD = {
    "schema_version": 1, "model": "gpt3-175b",
    "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 1024},
    "parallel": {"dp": 8, "tp": 8, "pp": 16, "cp": 1}, "sequence_parallel": True,
    "pipeline": {"schedule": "interleaved-1f1b", "vpp": 2}, "zero_stage": 1,
    "offload": {"optimizer": False, "params": False},
    "recompute": {"policy": "selective", "num_layers": None},
    "batch": {"micro_batch_size": 1, "global_batch_size": 1536}, "precision": "bf16",
}


def test_round_trip(tmp_path) -> None:
    plan = plan_from_dict(GOOD)
    path = save_plan(plan, tmp_path / "plan.yaml")
    assert load_plan(path) == plan
    assert yaml.safe_load(path.read_text())["parallel"] == GOOD["parallel"]


def test_inline_model_round_trips(tmp_path) -> None:
    inline = dict(GOOD, model={"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4,
                               "vocab_size": 256, "seq_len": 32})
    plan = plan_from_dict(inline)
    assert load_plan(save_plan(plan, tmp_path / "p.yaml")) == plan


def test_save_never_overwrites(tmp_path) -> None:
    plan = plan_from_dict(GOOD)
    path = save_plan(plan, tmp_path / "plan.yaml")
    before = path.read_text()
    with pytest.raises(ConfigError, match="already exists"):
        save_plan(plan.replace(zero_stage=2), path)
    assert path.read_text() == before
    save_plan(plan.replace(zero_stage=2), path, overwrite=True)
    assert load_plan(path).zero_stage == 2


@pytest.mark.parametrize(
    ("edit", "field", "hint"),
    [
        ({"parallel": {"tpp": 2}}, "parallel.tpp", "valid keys: dp, tp, pp, cp"),
        ({"parallel": {"tp": 0}}, "parallel.tp", "at least 1"),
        ({"parallel": {"tp": "8"}}, "parallel.tp", "integer"),
        ({"parallel": {"tp": 2.5}}, "parallel.tp", "integer"),
        ({"zero_stage": 4}, "zero_stage", "from 0 to 3"),
        ({"recompute": {"policy": "some"}}, "recompute.policy", "none, selective, full"),
        ({"pipeline": {"schedule": "1F1B"}}, "pipeline.schedule", "1f1b"),
        ({"sequence_parallel": "yes"}, "sequence_parallel", "true or false"),
        ({"batch": {"micro_batch_size": 1}}, "batch.global_batch_size", "missing"),
        ({"schema_version": 2}, "schema_version", "schema_version 1"),
        ({"colour": "red"}, "colour", "valid keys"),
        ({"model": ["a"]}, "model", "expected a preset name or a mapping of model fields"),
        ({"model": 7}, "model", "expected a preset name or a mapping of model fields"),
    ],
)
def test_bad_fields_name_field_value_and_fix(edit: dict, field: str, hint: str) -> None:
    data = {**GOOD, **edit}
    if "batch" in edit:
        data["batch"] = edit["batch"]
    with pytest.raises(ConfigError) as err:
        plan_from_dict(data)
    assert err.value.field == field
    assert hint in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_plan(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("parallel: {dp: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_plan(bad)


def test_world_size_and_microbatches() -> None:
    plan: Plan = plan_from_dict(GOOD)
    assert plan.world_size == 1024
    assert plan.num_microbatches == 1536 // 8
    assert plan_to_dict(plan)["schema_version"] == 1


def test_recompute_label_names_modules_and_the_uniform_groups() -> None:
    from autoplan.plan import Recompute, RecomputeMethod, RecomputeModule, RecomputePolicy

    assert Recompute(policy=RecomputePolicy.SELECTIVE).label() == "selective"
    assert Recompute(policy=RecomputePolicy.SELECTIVE, modules=(
        RecomputeModule.LAYERNORM, RecomputeModule.MOE)).label() == "selective(layernorm+moe)"
    assert Recompute(policy=RecomputePolicy.FULL, num_layers=4,
                     method=RecomputeMethod.UNIFORM).label() == "full-uniform:4"


def test_an_unknown_model_in_a_plan_file_is_named_as_the_plan_field(tmp_path, capsys) -> None:
    """It was reported as `--model: unknown model` for a plan given with --plan or to train."""
    from tests.cli_refusals import assert_refused

    plan = tmp_path / "plan.yaml"
    plan.write_text("model: nosuch\ncluster: {profile: cpu-gloo, num_gpus: 1}\n"
                    "batch: {micro_batch_size: 1, global_batch_size: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_plan(plan).model_spec()
    assert err.value.field == "model" and "unknown model 'nosuch'" in str(err.value)
    for argv in (["estimate", "--plan", str(plan)], ["train", str(plan)]):
        line = assert_refused(capsys, argv, "error: model: unknown model 'nosuch'")
        assert "--model" not in line
    assert_refused(capsys, ["estimate", "--model", "nosuch", "--cluster", "cpu-gloo",
                            "--num-gpus", "1"], "error: --model: unknown model 'nosuch'")
