"""An unknown key in a plan, model, profile or space file names the key it likely misspells before
the valid keys (yaml_io.unknown_key_fix, used by from_dict and plan.check_plan_keys), as the
DeepSpeed import does; with nothing close the line reads as before."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.hardware import profile_from_dict
from autoplan.model_spec import load_model
from autoplan.plan import PLAN_KEYS, plan_from_dict
from autoplan.resources import PROFILES, SPACES, find
from autoplan.search_space import space_from_dict
from autoplan.yaml_io import did_you_mean, unknown_key_fix

PLAN = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
        "batch": {"micro_batch_size": 1, "global_batch_size": 1}}
MODEL = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 256,
         "seq_len": 64}


def _renamed(data: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    out = dict(data)
    out[new] = out.pop(old)
    return out


def _shipped(kind: str, name: str) -> dict[str, Any]:
    return dict(yaml.safe_load(find(kind, name).read_text()))


def _refusal(load: Any, data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load(data)
    assert err.value.problem == "unknown key"
    return err.value


def test_a_plan_s_misspelt_top_key_is_named_in_the_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({**PLAN, "zero_stag": 1}))
    assert main(["estimate", "--plan", str(path)]) == 2
    assert capsys.readouterr().err == (
        "autoplan estimate: error: zero_stag: unknown key; did you mean 'zero_stage'? "
        f"valid keys: {', '.join(PLAN_KEYS)}\n")


@pytest.mark.parametrize("load, data, field, meant", [
    (plan_from_dict, {**PLAN, "parallel": {"tpp": 1}}, "parallel.tpp", "'tp'"),
    (load_model, _renamed(MODEL, "num_layers", "num_layer"), "model.num_layer", "'num_layers'"),
    (profile_from_dict, _renamed(_shipped(PROFILES, "cpu-gloo"), "gpus_per_node",
                                 "gpus_per_nod"), "profile.gpus_per_nod", "'gpus_per_node'"),
    (space_from_dict, _renamed(_shipped(SPACES, "small-cpu"), "micro_batch_size",
                               "micro_batch_sizes"), "micro_batch_sizes", "'micro_batch_size'"),
])
def test_each_strict_file_names_the_key_a_typo_meant(load, data, field, meant) -> None:
    err = _refusal(load, data)
    assert err.field.endswith(field)
    assert err.fix is not None and err.fix.startswith(f"did you mean {meant}? valid keys: ")


@pytest.mark.parametrize("key", ["foo", 7, "x" * 120])
def test_with_nothing_close_the_fix_is_the_valid_keys_alone(key) -> None:
    err = _refusal(plan_from_dict, {**PLAN, key: 1})
    assert err.fix == f"valid keys: {', '.join(PLAN_KEYS)}"


def test_did_you_mean_names_a_second_match_only_when_as_close() -> None:
    flags = ["--steps", "--seed", "--micro-batch-size", "--global-batch-size"]
    assert did_you_mean("--step", flags, 2, quote=False) == "did you mean --steps?"
    assert did_you_mean("--batch-size", flags, 2, quote=False) == (
        "did you mean --micro-batch-size or --global-batch-size?")
    assert did_you_mean("stag", ["stage"]) == "did you mean 'stage'?"
    assert did_you_mean(3, ["stage"]) is None and did_you_mean("zzz", ["stage"]) is None
    assert unknown_key_fix("stag", ("stage", "x")) == "did you mean 'stage'? valid keys: stage, x"
