"""Search spaces load strictly: presets load, mistakes are one-line ConfigErrors naming the
field, the value and the fix."""

from __future__ import annotations

import copy

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import Precision
from autoplan.search_space import load_space, space_from_dict
from autoplan.space_files import available_spaces
from tests.search.conftest import SMALL_SPACE


@pytest.mark.parametrize("name", ["default", "small-cpu"])
def test_presets_load_and_are_enumerable(name: str) -> None:
    space = load_space(name)
    assert space.size() <= space.max_enumerate
    assert name in available_spaces()


def test_default_space_is_large_enough_for_the_speed_target() -> None:
    assert load_space("default").size() >= 100_000


def test_scalar_is_accepted_for_a_list() -> None:
    space = space_from_dict(SMALL_SPACE)
    assert space.precision == (Precision.FP32,)


def _with(path: str, value: object) -> dict:
    data = copy.deepcopy(SMALL_SPACE)
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize("path,value,expect", [
    ("parallel.tpp", [1], "valid keys: dp, tp, pp, cp"),
    ("bogus", 1, "valid keys: name"),
    ("parallel.tp", [0, 2], "parallel.tp: got 0"),
    ("parallel.pp", [], "empty list"),
    ("zero_stage", [0, 4], "from 0 to 3"),
    ("micro_batch_size", [1, 1], "repeats"),
    ("recompute.num_layers", [None, 0], "recompute.num_layers"),
    ("pipeline.schedule", ["1f1b", "pipedream"], "choose one of gpipe, 1f1b"),
    ("sequence_parallel", ["yes"], "expected true or false"),
    ("schema_version", 2, "schema_version"),
])
def test_bad_space_is_one_line_error(path: str, value: object, expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        space_from_dict(_with(path, value))
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_bad_space_exits_2_with_one_line(space_file, capsys) -> None:
    path = space_file(_with("parallel.tp", [3, "x"]))
    code = main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                 "--global-batch-size", "8", "--space", str(path), "--format", "json"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "parallel.tp" in err


def test_unknown_space_name_lists_choices() -> None:
    with pytest.raises(ConfigError, match="default"):
        load_space("no-such-space")
