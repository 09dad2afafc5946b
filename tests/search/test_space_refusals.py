"""Spaces that leave no choice are refused in one line naming the knob (exit 2), the nearest
miss says why a bf16 reduce found nothing, and every JSON a search writes is valid JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.search.engine import run_search
from autoplan.search_space import space_from_dict
from tests.search.conftest import SMALL_SPACE, request

SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
          "--global-batch-size", "8"]


def _fails(capsys, argv: list[str], code: int, *needles: str) -> str:
    got = main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def _trials(sampler: str) -> list[str]:
    """The exhaustive sampler runs the whole space: it refuses a trial count."""
    return [] if sampler == "exhaustive" else ["--trials", "5"]


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe", "random"])
def test_full_recompute_without_a_group_size_is_refused(space_file, capsys, sampler) -> None:
    space = {**SMALL_SPACE, "recompute": {"policy": ["full"], "num_layers": [None],
                                          "method": ["uniform"]}}
    _fails(capsys, [*SEARCH, "--space", str(space_file(space)), "--sampler", sampler,
                    *_trials(sampler)], 2,
           "space space.yaml: recompute.method: policy full with method [uniform] needs a "
           "group size", "add a layer count to num_layers")


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe", "random"])
def test_moe_only_selective_modules_on_a_dense_model_are_refused(space_file, capsys,
                                                                 sampler) -> None:
    space = {**SMALL_SPACE, "recompute": {"policy": ["selective"], "modules": [["moe_act"]]}}
    _fails(capsys, [*SEARCH, "--space", str(space_file(space)), "--sampler", sampler,
                    *_trials(sampler)], 2,
           "recompute.modules: policy ['selective'] has no choice", "dense tiny",
           "add null or dense modules")


def test_moe_modules_beside_others_still_search_a_dense_model() -> None:
    space = {**SMALL_SPACE, "recompute": {"policy": ["none", "selective"],
                                          "modules": [["moe_act"]]}}
    assert run_search(request(space)).best is not None  # none is a choice


def test_a_bf16_reduce_on_a_fp16_device_says_what_to_change(space_file, capsys) -> None:
    space = space_file({"schema_version": 1, "name": "bf16reduce", "parallel": {"tp": [1, 2]},
                        "grad_reduce_dtype": ["bf16"]})
    for sampler in ("exhaustive", "random"):
        err = _fails(capsys, ["search", "--model", "gpt3-1.3b", "--cluster", "v100-sxm2-32gb",
                              "--num-gpus", "16", "--global-batch-size", "256", "--space",
                              str(space), "--sampler", sampler, *_trials(sampler)], 3,
                     "nearest (precision-unsupported)",
                     "grad_reduce_dtype=bf16 needs a bf16 or fp8 plan",
                     "add null or fp32 to the space's grad_reduce_dtype")
        assert "raise --trials" not in err


def test_a_schema_version_error_names_the_space_file(space_file, capsys) -> None:
    space = space_file({**SMALL_SPACE, "schema_version": 7}, "old.yaml")
    _fails(capsys, [*SEARCH, "--space", str(space)], 2, "space old.yaml: schema_version: got 7")
    with pytest.raises(ConfigError, match="^space: schema_version"):
        space_from_dict({"schema_version": 2, "name": "x"})


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_unpriced_profile_writes_null_dollars_not_nan(space_file, tmp_path: Path,
                                                         capsys) -> None:
    out = tmp_path / "out"
    argv = [*SEARCH, "--space", str(space_file(SMALL_SPACE)), "--train-tokens", "1e9",
            "--objective", "throughput,cost", "--top", "3"]
    assert main([*argv, "--out", str(out), "--format", "json"]) == 0
    shown: dict = _strict(capsys.readouterr().out)  # type: ignore[assignment]
    written: dict = _strict((out / "summary.json").read_text())  # type: ignore[assignment]
    assert [r["usd"] for r in written["top"]] == [None] * len(written["top"])
    assert written["top"] == shown["top"]
    assert main([*argv, "--format", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert [r["usd"] for r in as_yaml["top"]] == [None] * len(as_yaml["top"])


@pytest.mark.parametrize(("field", "values"), [("precision", ["fp32", "fp32"]),
                                               ("attention", ["flash", "flash"])])
def test_a_repeated_choice_is_named_as_the_file_spells_it(field: str, values: list[str]) -> None:
    """The repeats error shows the values as written, not Python's enum reprs."""
    data = {**SMALL_SPACE, field: values}
    with pytest.raises(ConfigError) as err:
        space_from_dict(data, "s.yaml")
    assert f"got {values} with repeats" in str(err.value) and "<" not in str(err.value)
