"""`autoplan import --set` takes assignments as `estimate --set` does: several after one --set,
or --set repeated, a field given twice only with one value (user test 34, finding 5:
`--set parallel.tp=2 parallel.pp=1` was "unrecognized arguments")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.commands import build_parser, main
from tests.cli_refusals import assert_refused

DS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 8, "bf16": {"enabled": True}}


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS), encoding="utf-8")
    return path


def _import(ds: Path, *sets: str) -> list[str]:
    return ["import", str(ds), "--from", "deepspeed", "--model", "gpt3-1.3b", "--cluster",
            "h100-sxm-80gb", "--num-gpus", "16", *sets, "--format", "json"]


def test_several_assignments_after_one_set_are_the_same_as_set_repeated(ds: Path, capsys) -> None:
    assert main(_import(ds, "--set", "parallel.tp=2", "parallel.pp=1", "zero_stage=1")) == 0
    one = json.loads(capsys.readouterr().out)
    assert (one["parallel"]["tp"], one["parallel"]["dp"], one["zero_stage"]) == (2, 8, 1)
    assert main(_import(ds, "--set", "parallel.tp=2", "--set", "parallel.pp=1",
                        "--set", "zero_stage=1")) == 0
    assert json.loads(capsys.readouterr().out) == one


def test_a_field_given_twice_must_get_one_value(ds: Path, capsys) -> None:
    """Refused before the importer reads tp (it took the last one and said the model was
    split another way than asked)."""
    assert main(_import(ds, "--set", "parallel.tp=2", "parallel.tp=2")) == 0
    capsys.readouterr()
    assert_refused(capsys, _import(ds, "--set", "parallel.tp=2", "parallel.tp=4"),
                   "--set parallel.tp: given twice, as 2 and as 4")


def test_file_after_the_assignments_is_refused_naming_the_fix(ds: Path, capsys) -> None:
    argv = _import(ds, "--set", "parallel.tp=2")
    argv.remove(str(ds))
    argv.insert(argv.index("parallel.tp=2") + 1, str(ds))  # import --set parallel.tp=2 ds.json
    with pytest.raises(SystemExit) as exited:  # argparse's refusal: exit 2, one line
        main(argv)
    out = capsys.readouterr()
    assert exited.value.code == 2 and out.err.count("\n") == 1 and not out.out
    assert f"error: --set: got {str(ds)!r}, which is no KEY=VALUE: give FILE before --set" \
        in out.err


def test_the_help_says_several_follow_one_set() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    help_text = " ".join(sub["import"].format_help().split())
    assert "several after one --set, or --set repeated" in help_text
    assert "one per --set" not in help_text
