"""A Ctrl-C or SIGTERM that lands on the last step of --steps stops nothing: the run trained
every step and saved its checkpoint, so neither the summary's note nor the exit line advises
--resume (which refuses a checkpoint at --steps); a run stopped early without
--checkpoint-dir is told to rerun, not to resume (review finding H1.1)."""

from __future__ import annotations

import argparse
import json
import os
import signal

import pytest

from autoplan.commands import main
from autoplan.plan_files import save_plan
from autoplan.runtime import summary as run_summary
from autoplan.runtime import worker
from autoplan.runtime.metrics import StepMetrics
from autoplan.runtime.summary import summarize
from tests.dist.parity import make_plan

PRED = {"step_time_s": 0.05, "tokens_per_s": 1e4, "memory_bytes": 1e6,
        "runtime": "autoplan-cpu", "error_band": 0.25}


def _history(n: int) -> list[StepMetrics]:
    return [StepMetrics(step, 5.0, 0.05, 1e4, 1 << 20, 0.5) for step in range(1, n + 1)]


@pytest.fixture
def predicted_50ms(monkeypatch):
    monkeypatch.setattr(run_summary, "predicted", lambda plan: (dict(PRED), None))


def test_a_stop_on_the_last_step_is_no_early_stop_and_advises_no_resume(predicted_50ms):
    stop = worker.STOP_FILE_REASON
    done = summarize(_history(1), make_plan(), stopped_early=stop, steps=1)
    assert done["stopped_early"] is None
    assert done["note"] == ("step time not measured: the run had no step after its 1 warm-up "
                            "step (this run trained 1 step: --steps 2 or more measures one)")
    early = summarize(_history(1), make_plan(), stopped_early=stop, steps=5)
    assert early["stopped_early"] == stop
    assert early["note"].endswith("resume it (--resume) to measure one")


def test_a_run_stopped_early_without_checkpoints_is_told_to_rerun(predicted_50ms):
    summary = summarize(_history(1), make_plan(), stopped_early="SIGINT", steps=5,
                        checkpointed=False)
    assert "--resume" not in summary["note"]
    assert summary["note"].endswith("without --checkpoint-dir it saved nothing to resume: "
                                    "rerun it to measure one")


def _fake_torchrun(summary: dict, signum: int):
    """run_supervised as it returns after a signal that came during the last step: the ranks
    finished, saved and wrote their summary."""
    from autoplan.runtime.supervise import Outcome

    def run(cmd, env, stop_file, grace_s):
        with open(os.path.join(os.path.dirname(stop_file), "summary.json"), "w") as f:
            json.dump(summary, f)
        return Outcome(returncode=0, signal=signum)

    return run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_exit_line_of_a_run_that_finished_says_so(tmp_path, capsys, monkeypatch,
                                                      predicted_50ms, signum):
    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    ranks = summarize(_history(3), make_plan("h8-2l"), stopped_early=worker.STOP_FILE_REASON,
                      steps=3)
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", _fake_torchrun(ranks, signum))
    ck = tmp_path / "ck"
    code = main(["train", plan_path, "--steps", "3", "--checkpoint-dir", str(ck),
                 "--format", "json"])
    out, err = capsys.readouterr()
    name = signal.Signals(signum).name
    assert code == 128 + signum, err  # a signal came: its exit code, as before
    summary = json.loads(out)
    assert summary["stopped_early"] is None and summary["final_step"] == 3
    assert "error:" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"autoplan train: warning: {name} came as the run ended: step 3, the last of --steps 3, "
        f"finished; checkpoint step-00000003 saved in {ck}, nothing left to resume")
    code = main(["train", plan_path, "--steps", "3", "--format", "table"])
    out, err = capsys.readouterr()
    assert code == 128 + signum and "stopped early" not in out, out
    assert err.strip().splitlines()[-1] == (
        f"autoplan train: warning: {name} came as the run ended: step 3, the last of --steps 3, "
        "finished (no --checkpoint-dir: nothing saved)")  # a finished run: no error line


def test_a_run_the_signal_stopped_still_ends_on_an_error_line(tmp_path, capsys, monkeypatch,
                                                               predicted_50ms):
    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    ranks = summarize(_history(2), make_plan("h8-2l"), stopped_early=worker.STOP_FILE_REASON,
                      steps=5)
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised",
                        _fake_torchrun(ranks, signal.SIGTERM))
    ck = tmp_path / "ck"
    code = main(["train", plan_path, "--steps", "5", "--checkpoint-dir", str(ck),
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 143 and json.loads(out)["stopped_early"] == "SIGTERM"
    assert err.strip().splitlines()[-1] == (
        f"autoplan train: error: stopped by SIGTERM after step 2; checkpoint step-00000002 "
        f"saved in {ck}; continue with --resume")


def test_a_killed_run_whose_newest_checkpoint_is_the_last_step_is_not_told_to_resume(tmp_path):
    from autoplan.runtime.launch import _saved
    from tests.dist.parity import TEST_MODELS
    from tests.unit.runtime.test_checkpoint_files import _save

    ck = tmp_path / "ck"
    ck.mkdir()
    _save(ck / "step-00000004", TEST_MODELS["h8-2l"], step=4)
    args = argparse.Namespace(checkpoint_dir=str(ck), steps=4)
    assert _saved(args) == (f"step-00000004 in {ck} holds the last step of --steps 4: nothing "
                            "is left to resume")
    args.steps = 6
    assert _saved(args) == "--resume continues from step-00000004 (step 4)"


@pytest.mark.parametrize(("steps", "stopped"), [(3, None), (5, "SIGTERM")])
def test_a_signalled_run_writes_the_run_record_of_the_steps_it_trained(
        tmp_path, capsys, monkeypatch, predicted_50ms, steps, stopped):
    """User test 37, finding 3: a run Ctrl-C or SIGTERM stopped (or that finished as the signal
    came) wrote no --run-record, and said nothing; the steps it trained were measured, and
    `autoplan calibrate` reads them."""
    from autoplan.calibrate_runs import load_run

    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    ranks = summarize(_history(3), make_plan("h8-2l"), stopped_early=worker.STOP_FILE_REASON,
                      steps=steps)
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised",
                        _fake_torchrun(ranks, signal.SIGTERM))
    record = tmp_path / "run.json"
    code = main(["train", plan_path, "--steps", str(steps), "--run-record", str(record),
                 "--format", "json"])
    capsys.readouterr()
    assert code == 143
    data = json.loads(record.read_text())
    assert data["measured"]["stopped_early"] == stopped
    assert data["measured"]["step_time_s"] == pytest.approx(0.05)
    assert load_run(record).measured.step_time_s == pytest.approx(0.05)


def test_a_killed_run_says_its_run_record_was_not_written(tmp_path, caplog, monkeypatch):
    from autoplan.runtime.supervise import Outcome

    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised",
                        lambda cmd, env, stop_file, grace_s: Outcome(
                            returncode=-9, signal=signal.SIGTERM, killed=True))
    record = tmp_path / "run.json"
    code = main(["train", plan_path, "--steps", "5", "--run-record", str(record)])
    assert code == 143 and not record.exists()
    assert f"--run-record {record} not written" in caplog.text
