"""Hostile files through the real loaders and the CLI: alias bombs, deep nesting, huge integers.

Each case must end as one line on stderr with exit code 2, quickly and without a traceback
(issue #14 items 4, 6 and 7).
"""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.yaml_io import read_yaml
from autoplan.yaml_parse import MAX_YAML_DEPTH, MAX_YAML_NODES, load_json_text

PLAN = (
    "model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 2}\nparallel: {dp: 2}\n"
    "batch: {micro_batch_size: 1, global_batch_size: 2}\n"
)


def _bomb(levels: int = 9) -> str:
    """The billion-laughs shape: each level lists the previous one nine times (~9**levels)."""
    lines = ['  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*l{i - 1}"] * 9)
        lines.append(f"  l{i}: &l{i} [{refs}]")
    return "predicted:\n" + "\n".join(lines) + "\n"


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_exit_2(code: int, err: str) -> None:
    assert code == 2, err[-2000:]
    assert err.count("\n") == 1 and len(err) < 1000, err[:2000]


def test_alias_bomb_in_a_plan_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN + _bomb())
    assert len(path.read_bytes()) < 700  # a small file that expands to ~400 million strings
    code, _, err = _run(["estimate", "--plan", str(path), "--format", "json"], capsys)
    _one_line_exit_2(code, err)
    assert "alias" in err or str(MAX_YAML_NODES) in err


def test_self_referencing_alias_is_refused(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="refers to itself"):
        read_yaml(path, "X")


def test_a_few_aliases_still_load(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: &a {x: 1}\nb: *a\n")
    assert read_yaml(path, "X") == {"a": {"x": 1}, "b": {"x": 1}}


@pytest.mark.parametrize("where", ["predicted", "model"])
def test_yaml_nested_500_deep_is_refused(tmp_path, capsys, where) -> None:
    deep = "[" * 500 + "]" * 500
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN + f"{where}: {{x: {deep}}}\n" if where == "predicted" else
                    PLAN.replace("model: tiny", f"model: {deep}"))
    code, _, err = _run(["estimate", "--plan", str(path)], capsys)
    _one_line_exit_2(code, err)
    assert f"deeper than {MAX_YAML_DEPTH}" in err


@pytest.mark.parametrize("depth", [500, 5000])
def test_json_nested_deep_is_refused(tmp_path, capsys, depth) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}")
    code, _, err = _run(["estimate", "--model", str(path), "--cluster", "cpu-gloo",
                         "--num-gpus", "2"], capsys)
    _one_line_exit_2(code, err)
    assert "deeper than" in err


def test_deepspeed_json_nested_deep_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8, "zero_optimization": ' + "{\"a\":" * 600 + "1"
                    + "}" * 600 + "}")
    code, _, err = _run(["import", str(path), "--from", "deepspeed", "--model", "tiny",
                         "--cluster", "cpu-gloo", "--num-gpus", "2"], capsys)
    _one_line_exit_2(code, err)


def test_json_loader_refuses_nan_and_huge_numbers() -> None:
    with pytest.raises(ConfigError, match="NaN"):
        load_json_text('{"a": NaN}', "X")
    with pytest.raises(ConfigError, match="digits"):
        load_json_text('{"a": ' + "9" * 5000 + "}", "X")
    assert load_json_text(json.dumps({"a": [1, 2]}), "X") == {"a": [1, 2]}


def test_yaml_integer_with_too_many_digits(tmp_path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("dp: 2", "dp: " + "9" * 5000))
    code, _, err = _run(["estimate", "--plan", str(path)], capsys)
    _one_line_exit_2(code, err)


def test_long_values_are_truncated_in_errors(tmp_path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("model: tiny", "model: [" + ",".join(["1234567"] * 20000) + "]"))
    code, _, err = _run(["estimate", "--plan", str(path)], capsys)
    _one_line_exit_2(code, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
         "--seq-len", "4611686018427387904"],
        ["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "99999999999999999999"],
        ["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
         "--global-batch-size", "99999999999999999999"],
    ],
)
def test_integers_past_int64_on_the_command_line(argv, capsys) -> None:
    code, _, err = _run(["estimate", *argv, "--format", "json"], capsys)
    _one_line_exit_2(code, err)


@pytest.mark.parametrize(
    "field, value",
    [("hidden_size", 2**62), ("num_layers", 2**62), ("vocab_size", 2**70), ("seq_len", 2**40),
     ("ffn_hidden_size", 2**63)],
)
def test_model_sizes_past_their_maximum(tmp_path, capsys, field, value) -> None:
    spec = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 256,
            "seq_len": 64, field: value}
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps(spec))
    code, _, err = _run(["estimate", "--model", str(path), "--cluster", "cpu-gloo",
                         "--num-gpus", "2", "--format", "json"], capsys)
    _one_line_exit_2(code, err)
    assert field in err


def test_hf_hidden_size_past_int64(tmp_path, capsys) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 2**64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
           "max_position_embeddings": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = _run(["estimate", "--model", str(path), "--cluster", "cpu-gloo",
                         "--num-gpus", "2"], capsys)
    _one_line_exit_2(code, err)
    assert "hidden_size" in err


def test_plan_value_past_int64(tmp_path, capsys) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("global_batch_size: 2", "global_batch_size: 9223372036854775808"))
    code, _, err = _run(["estimate", "--plan", str(path)], capsys)
    _one_line_exit_2(code, err)
    assert "global_batch_size" in err


@pytest.mark.parametrize("value", ["predicted=&a [*a]", "parallel.dp=" + "9" * 5000,
                                   "predicted=" + "[" * 400 + "]" * 400])
def test_hostile_set_values(tmp_path, capsys, value) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    code, _, err = _run(["estimate", "--plan", str(path), "--set", value, "--format", "json"],
                        capsys)
    _one_line_exit_2(code, err)
    assert "--set" in err


def test_over_long_file_names(capsys) -> None:
    for argv in (["estimate", "--plan", "x" * 300], ["estimate", "--model", "x" * 300 + ".yaml",
                                                      "--cluster", "cpu-gloo", "--num-gpus", "2"]):
        code, _, err = _run(argv, capsys)
        _one_line_exit_2(code, err)
