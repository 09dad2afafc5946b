"""A tune resuming its --study says so ("resumed study t: N trials stored, M new", search's
words) and runs only the trials left; its --dry-run shows the stored trials with their
measurements at 0 s and predicts only the rest (user test 38, S1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autoplan.commands import main

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2", "--top", "2", "--steps", "3"]
# a stand-in for `autoplan train` (its metrics-file protocol); argv[3] seconds of sleep first
FAKE_TRAIN = ("import json, sys, time\n"
              "time.sleep(float(sys.argv[3]))\n"
              "with open(sys.argv[1], 'w') as fh:\n"
              "    for step in range(1, int(sys.argv[2]) + 1):\n"
              "        fh.write(json.dumps({'step': step, 'step_time_s': 0.01}) + '\\n')\n")


def _fake_train(monkeypatch, sleep_s: float = 0.0) -> list[Path]:
    """Trials run FAKE_TRAIN; returns the plan paths they were given, in order."""
    ran: list[Path] = []

    def fake(plan_path: Path, nproc: int, steps: int, metrics: Path) -> list[str]:
        ran.append(plan_path)
        return [sys.executable, "-c", FAKE_TRAIN, str(metrics), str(steps), str(sleep_s)]

    monkeypatch.setattr("autoplan.tune.runner.train_command", fake)
    return ran


def _url(kind: str, path: Path) -> str:
    return f"sqlite:///{path}" if kind == "sqlite" else f"journal:{path}"


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _table(capsys, argv: list[str]) -> str:
    assert main([*argv, "--format", "table"]) == 0
    return " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_finished_study_is_shown_done_and_its_rerun_runs_nothing(
        tmp_path: Path, capsys, monkeypatch, kind: str) -> None:
    ran = _fake_train(monkeypatch)
    monkeypatch.chdir(tmp_path)
    study = [*TUNE, "--storage", _url(kind, tmp_path / "t.store"), "--study", "t"]
    first = _json(capsys, study)
    assert "studies" in first and first["studies"][0]["stored"] == 0
    assert len(ran) == 2 and [t["status"] for t in first["trials"]] == ["complete"] * 2

    dry = _json(capsys, [*study, "--dry-run"])
    assert dry["stored"] == 2 and dry["predicted_total_s"] == 0
    assert [r["status"] for r in dry["trials"]] == ["complete"] * 2
    assert [r["predicted_trial_s"] for r in dry["trials"]] == [0, 0]
    assert [r["measured_step_s"] for r in dry["trials"]] == \
        [t["measured_step_s"] for t in first["trials"]]
    shown = _table(capsys, [*study, "--dry-run"])
    assert "trials of study t: 2 stored (not run again), 0 to run" in shown, shown
    assert "study t holds a result for every plan, so the tune runs none" in shown, shown

    again = _json(capsys, study)
    assert len(ran) == 2  # nothing ran again
    assert again["studies"] == [{"study": "t", "stored": 2, "new": 0}]
    shown = _table(capsys, study)
    assert "resumed study t: 2 trials stored, none new (every plan has a result" in shown, shown
    assert len(ran) == 2


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_study_with_trials_left_predicts_and_runs_only_those(
        tmp_path: Path, capsys, monkeypatch, kind: str) -> None:
    # the first trial alone outlasts a 1 s budget: the second is left not run
    ran = _fake_train(monkeypatch, sleep_s=1.5)
    monkeypatch.chdir(tmp_path)
    study = [*TUNE, "--storage", _url(kind, tmp_path / "t.store"), "--study", "t"]
    first = _json(capsys, [*study, "--budget-s", "1"])
    assert [t["status"] for t in first["trials"]] == ["complete", "not run"]
    assert len(ran) == 1

    fresh = _json(capsys, [*TUNE, "--dry-run"])  # no study: every trial predicted
    dry = _json(capsys, [*study, "--dry-run"])
    assert dry["stored"] == 1
    assert [r["status"] for r in dry["trials"]] == ["complete", "to run"]
    left = fresh["trials"][1]["predicted_trial_s"]
    assert dry["trials"][0]["predicted_trial_s"] == 0
    assert dry["predicted_total_s"] == pytest.approx(left) and left > 0
    shown = _table(capsys, [*study, "--dry-run"])
    assert "for the 1 trials left (study t holds 1, shown with their measurements)" in shown

    _fake_train(monkeypatch)  # quick trials from here
    shown = _table(capsys, study)
    assert "resumed study t: 1 trials stored, 1 new" in shown, shown
    assert "(every plan" not in shown
