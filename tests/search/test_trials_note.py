"""`--trials` where no --sampler is given and the space is small enough to score whole: the
default sampler is then exhaustive, and one stderr line says the count is ignored and how to
sample instead (it was silently dropped, while `--sampler exhaustive --trials N` is refused).
The line comes last and only on success: a search that fails still says one line."""

from __future__ import annotations

import json

from autoplan.commands import main

SMALL = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
         "--global-batch-size", "16", "--space", "small-cpu", "--format", "json"]
NOTE = ("autoplan search: note: --trials 5 was ignored: the space is small enough to score every "
        "candidate (the exhaustive sampler); add --sampler tpe, nsga2 or random to sample 5 "
        "trials")


def test_trials_ignored_by_the_default_exhaustive_sampler_is_said(capsys) -> None:
    assert main([*SMALL, "--trials", "5"]) == 0
    captured = capsys.readouterr()
    assert [line for line in captured.err.splitlines() if "note:" in line] == [NOTE]
    data = json.loads(captured.out)
    assert data["sampler"] == "exhaustive" and data["candidates"] > 5


def test_no_note_where_trials_is_used_or_not_given(capsys) -> None:
    assert main([*SMALL, "--trials", "5", "--sampler", "random"]) == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.err and json.loads(captured.out)["sampler"] == "random"
    assert main(SMALL) == 0
    assert "note:" not in capsys.readouterr().err


def test_a_failed_search_still_says_one_line(capsys) -> None:
    argv = [*SMALL, "--trials", "5", "--max-step-time-s", "1e-9"]  # no plan is that fast
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no feasible plan" in err and "note:" not in err
