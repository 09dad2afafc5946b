"""One list of a plan file's top-level keys (plan.PLAN_KEYS): the loader and estimate's --plan,
which checks a file's keys before the flags add fields, refuse an unknown key with the same
line, schema_version listed in both."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import PLAN_KEYS, Plan, plan_from_dict

PLAN = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
        "batch": {"micro_batch_size": 1, "global_batch_size": 1}}


def test_the_keys_are_the_plans_fields_and_its_schema_version() -> None:
    assert set(PLAN_KEYS) == {f.name for f in dataclasses.fields(Plan)} | {"schema_version"}
    assert plan_from_dict({**PLAN, "schema_version": 1}).batch.global_batch_size == 1


@pytest.mark.parametrize("key", ["foo", 7, "two words", "x" * 120])
def test_the_loader_and_estimate_refuse_an_unknown_key_alike(tmp_path, capsys, key) -> None:
    with pytest.raises(ConfigError) as loader:
        plan_from_dict({**PLAN, key: 1})
    assert "schema_version" in str(loader.value)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PLAN, key: 1}))
    assert main(["estimate", "--plan", str(path)]) == 2
    assert capsys.readouterr().err == f"autoplan estimate: error: {loader.value}\n"
