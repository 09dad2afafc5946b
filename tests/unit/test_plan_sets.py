"""`--set` edits (autoplan/plan_sets.py): order-free, a field given two values refused, a
mapping merged with the fields set beside it."""

from __future__ import annotations

import json
import math

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan_sets import apply_sets


def _applied(sets: list[str], data: dict | None = None) -> dict:
    data = {} if data is None else data
    apply_sets(data, sets)
    return data


@pytest.mark.parametrize("sets", [
    ["parallel.tp=2", "parallel={pp: 4}"],  # once lost tp: the mapping replaced the section
    ["parallel={pp: 4}", "parallel.tp=2"],
    ["parallel={tp: 2}", "parallel={pp: 4}"],
    ["parallel={tp: 2, pp: 4}", "parallel.tp=2"],  # the same value again
])
def test_a_mapping_merges_with_the_fields_set_beside_it(sets) -> None:
    assert _applied(sets) == {"parallel": {"tp": 2, "pp": 4}}


def test_a_mapping_replaces_the_plan_files_section_and_a_field_edits_it() -> None:
    plan = {"parallel": {"tp": 8, "cp": 2}, "pipeline": {"schedule": "1f1b", "vpp": 1}}
    assert _applied(["parallel={pp: 4}", "parallel.tp=2", "pipeline.vpp=2"], plan) == {
        "parallel": {"pp": 4, "tp": 2}, "pipeline": {"schedule": "1f1b", "vpp": 2}}


@pytest.mark.parametrize(("sets", "message"), [
    (["parallel.tp=2", "parallel.tp=4"],
     "--set parallel.tp: given twice, as 2 and as 4; give it once, or the same value both times"),
    (["parallel={tp: 2}", "parallel.tp=4"], "--set parallel.tp: given twice, as 2 and as 4"),
    (["parallel.tp=4", "parallel={tp: 2, pp: 4}"], "--set parallel.tp: given twice, as 4 and as 2"),
    (["zero_stage=1", "zero_stage=true"], "--set zero_stage: given twice, as 1 and as True"),
    (["parallel=7", "parallel.tp=2"], "--set parallel: got 7 and --set parallel.tp, which needs"),
    (["parallel.tp=2", "parallel=7"], "--set parallel: got 7 and --set parallel.tp, which needs"),
])
def test_two_values_for_one_field_are_refused(sets, message) -> None:
    with pytest.raises(ConfigError) as err:
        _applied(sets)
    assert str(err.value).startswith(message)
    assert err.value.exit_code == 2


def test_a_nan_given_twice_is_one_value_for_the_loader_to_refuse(capsys) -> None:
    """`--set x=.nan --set x=.nan` said "given twice, as nan and as nan" (NaN != NaN); the same
    value twice is one edit, and the plan loader names what is wrong with it."""
    assert math.isnan(_applied(["batch.global_batch_size=.nan"] * 2)["batch"]["global_batch_size"])
    assert main([*TINY, "--set", "batch.micro_batch_size=.nan",
                 "--set", "batch.micro_batch_size=.nan"]) == 2
    err = capsys.readouterr().err
    assert "given twice" not in err and "batch.micro_batch_size" in err


def test_a_field_under_a_plan_files_scalar_is_refused() -> None:
    with pytest.raises(ConfigError, match="'parallel' is not a section"):
        _applied(["parallel.tp=2"], {"parallel": 7})


TINY = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "8",
        "--global-batch-size", "8", "--format", "json"]


def test_estimate_refuses_a_field_set_twice(capsys) -> None:
    assert main([*TINY, "--set", "parallel.tp=2", "--set", "parallel.tp=4"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "autoplan estimate: error: --set parallel.tp: given twice, as 2 and as 4; give it once, "
        "or the same value both times"]


@pytest.mark.parametrize("sets", [["parallel.tp=2", "parallel={pp: 2}"],
                                  ["parallel={tp: 2}", "parallel.pp=2"]])
def test_estimate_prices_the_merged_degrees(capsys, sets) -> None:
    assert main([*TINY, *[x for s in sets for x in ("--set", s)]]) == 0
    parallel = json.loads(capsys.readouterr().out)["plan"]["parallel"]
    assert (parallel["dp"], parallel["tp"], parallel["pp"]) == (2, 2, 2)


def test_dp_from_a_second_mapping_is_kept(capsys) -> None:
    """dp follows from the GPU count unless a --set gives it, in whichever mapping."""
    assert main([*TINY, "--set", "parallel={tp: 2}", "--set", "parallel={dp: 2, pp: 2}"]) == 0
    parallel = json.loads(capsys.readouterr().out)["plan"]["parallel"]
    assert (parallel["dp"], parallel["tp"], parallel["pp"]) == (2, 2, 2)


def test_dp_set_beside_the_degrees_must_multiply_to_the_gpus(capsys) -> None:
    assert main([*TINY, "--set", "parallel={tp: 2}", "--set", "parallel={dp: 1}"]) == 2
    assert "cluster has 8 GPUs" in capsys.readouterr().err
