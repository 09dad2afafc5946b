"""A search that resumes a stored study says so: the trials it found, those it added, and that
--trials is the study's total (user test 34, finding 4: a rerun with the same --trials added no
trial and printed nothing about it)."""

from __future__ import annotations

import json
from pathlib import Path

from autoplan.commands import build_parser, main
from autoplan.search.summary import resumed_lines


def _search(tmp_path: Path, trials: int, *extra: str) -> list[str]:
    return ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
            "--global-batch-size", "8", "--space", "small-cpu", "--sampler", "random",
            "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--study", "s1",
            "--trials", str(trials), *extra]


def test_each_run_says_what_it_found_and_added(tmp_path: Path, capsys) -> None:
    assert main(_search(tmp_path, 3, "--format", "json")) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["studies"] == [{"study": "s1", "stored": 0, "new": 3, "held": 3,
                                  "trials": 3}]

    assert main(_search(tmp_path, 5, "--format", "table")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "resumed study s1: 3 trials stored, 2 new (--trials 5 is the study's total)"
    assert lines[1].startswith("tiny on 4 x cpu-gloo")  # the header line follows

    out = tmp_path / "out"
    assert main(_search(tmp_path, 5, "--format", "table", "--out", str(out))) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "resumed study s1: 5 trials stored, none new (--trials 5 is the study's total): raise "
        "--trials above 5 to sample more")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["studies"] == [{"study": "s1", "stored": 5, "new": 0, "held": 5,
                                   "trials": 5}]
    assert summary["candidates"] == 5  # the study's trials, every one ranked


def test_a_search_without_storage_has_no_studies(capsys) -> None:
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
            "--global-batch-size", "8", "--space", "small-cpu", "--format", "json"]
    assert main(argv) == 0
    assert "studies" not in json.loads(capsys.readouterr().out)


def test_a_new_study_prints_no_resumed_line_and_each_type_its_own() -> None:
    studies = [{"study": "m/h100-sxm-80gb", "stored": 0, "new": 4, "trials": 4},
               {"study": "m/a100-sxm4-80gb", "stored": 4, "new": 0, "trials": 4}]
    assert resumed_lines(studies) == [
        "resumed study m/a100-sxm4-80gb: 4 trials stored, none new (--trials 4 is the study's "
        "total): raise --trials above 4 to sample more"]


def test_trials_help_says_it_is_the_studys_total() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    text = " ".join(sub["search"].format_help().split())
    assert "with --storage, the study's total: a resumed study samples only the trials it lacks" \
        in text
