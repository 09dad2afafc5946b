"""autoplan.yaml_io: a key written twice, a directory or a device where a file belongs, and a
directory as the target of a save are each one ConfigError naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.yaml_io import read_yaml, write_text_atomic
from autoplan.yaml_parse import load_json_text, safe_load_text


@pytest.mark.parametrize("text", [
    "parallel: {dp: 8, tp: 1, tp: 2}",
    "parallel:\n  dp: 8\n  tp: 1\n  tp: 2\n",
    "1: a\n0x1: b\n",  # the same integer key, spelt twice
])
def test_a_yaml_key_written_twice_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="duplicate key") as err:
        safe_load_text(text, "--plan p.yaml")
    assert "\n" not in str(err.value)


def test_merge_keys_may_still_be_overridden() -> None:
    data = safe_load_text("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n", "f")
    assert data["d"] == {"x": 3, "y": 2}


def test_a_json_key_written_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate key 'tp'"):
        load_json_text('{"parallel": {"dp": 8, "tp": 1, "tp": 2}}', "config.json")
    assert load_json_text('[{"a": 1}, {"a": 1}]', "x") == [{"a": 1}, {"a": 1}]


def test_estimate_refuses_a_plan_with_a_duplicate_key(tmp_path: Path, capsys) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 8}\n"
                    "parallel: {dp: 8, tp: 1, tp: 2}\n")
    assert main(["estimate", "--plan", str(plan), "--format", "json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "duplicate key 'tp'" in err and "line 3" in err, err


def test_a_directory_or_a_device_is_not_called_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        read_yaml(tmp_path, "--plan")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_yaml("/dev/null", "--plan")
    with pytest.raises(ConfigError, match="no such file"):
        read_yaml(tmp_path / "absent.yaml", "--plan")


@pytest.mark.parametrize("argv", [
    ["estimate", "--plan", "{dir}"],
    ["estimate", "--plan", "/dev/null"],
    ["calibrate", "{dir}", "--profile", "cpu-gloo"],
])
def test_commands_name_a_directory_as_one(tmp_path: Path, capsys, argv: list[str]) -> None:
    argv = [a.format(dir=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert ("is a directory" in err or "not a regular file" in err) and "no such" not in err


def test_a_save_onto_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        write_text_atomic(tmp_path / "adir", "a: 1\n", overwrite=True)
    assert list((tmp_path / "adir").iterdir()) == []


def test_a_binary_file_says_what_is_wrong_and_the_fix(tmp_path: Path, capsys) -> None:
    """It said `cannot read ... (UnicodeDecodeError)`, with no fix."""
    from tests.cli_refusals import assert_refused

    binary = tmp_path / "model.yaml"
    binary.write_bytes(b"\xff\xfe\x00bin")
    with pytest.raises(ConfigError) as err:
        read_yaml(binary, "--model")
    assert err.value.fix == "save it as UTF-8 YAML"
    assert "byte 0xff at offset 0 is not UTF-8 text" in err.value.problem
    assert_refused(capsys, ["estimate", "--model", str(binary), "--cluster", "cpu-gloo",
                            "--num-gpus", "1"], "--model: cannot read", "save it as UTF-8 YAML")


def test_a_broken_json_file_is_called_json_and_named_once(tmp_path: Path, capsys) -> None:
    """`calibrate trunc.json` said "RUN trunc.json 'trunc.json': not valid YAML" (user test 38
    N5): the file named twice, and JSON called YAML."""
    trunc = tmp_path / "trunc.json"
    trunc.write_text('{"plan": {"model": "tiny"')
    assert main(["calibrate", str(trunc), "--profile", "cpu-gloo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid JSON (Expecting ',' delimiter at line 1, column 26)" in err, err
    assert "YAML" not in err and err.count("trunc.json") == 1, err
    broken = tmp_path / "broken.yaml"  # a .yaml file's mistakes stay YAML's
    broken.write_text("plan: [\n")
    with pytest.raises(ConfigError, match="not valid YAML at line 2"):
        read_yaml(broken, "--plan")


def test_json_that_yaml_cannot_read_is_read_as_json(tmp_path: Path) -> None:
    """A tab indenting JSON is no YAML token; json.dump(..., indent="\\t") writes it."""
    tabs = tmp_path / "run.json"
    tabs.write_text('{\n\t"plan": {\n\t\t"model": "tiny"\n\t}\n}\n')
    assert read_yaml(tabs, "RUN") == {"plan": {"model": "tiny"}}
    with pytest.raises(ConfigError, match="not valid YAML"):  # the same text as .yaml is not
        read_yaml(tabs.rename(tmp_path / "run.yaml"), "RUN")
