"""`autoplan tune` end to end with the real runtime: short gloo runs, pruning, resume."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.plan_files import load_plan
from autoplan.tune.study import trial_key

pytestmark = pytest.mark.dist


def test_tune_runs_real_plans_prunes_and_resumes(tmp_path, capsys) -> None:
    argv = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
            "--global-batch-size", "8", "--top", "3", "--steps", "5", "--budget-s", "300",
            "--trial-timeout-s", "120", "--storage", f"sqlite:///{tmp_path / 't.db'}",
            "--study", "t", "--out", str(tmp_path / "out"), "--format", "json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    statuses = [t["status"] for t in first["trials"]]
    assert set(statuses) <= {"complete", "pruned", "failed"} and "complete" in statuses
    done = [t for t in first["trials"] if t["status"] == "complete"]
    best = min(done, key=lambda t: t["measured_step_s"])
    chosen = load_plan(tmp_path / "out" / "plan.yaml")
    assert trial_key(chosen) == best["key"]  # the measured best of the completed trials
    # rerun: every trial is already decided in the study, nothing runs again
    assert main(argv + ["--force"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in again["trials"]] == statuses
    assert again["seconds"] < 5
