"""`train --format json` (user test 34, finding 6): the summary's keys, said once (`note`; the
prediction's part of it goes to the run record alone), how the run came to continue from
`resumed_from` and after how many restarts, and on Ctrl-C the summary of the steps trained,
marked as stopped early, before the exit code 130."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import types

import pytest
from rich.console import Console

from autoplan.commands import main
from autoplan.plan_files import save_plan
from autoplan.runtime import summary as run_summary
from autoplan.runtime import worker
from autoplan.runtime.metrics import StepMetrics
from autoplan.runtime.summary import render_summary, run_record, summarize
from autoplan.runtime.summary_notes import band_note
from tests.dist.parity import make_plan

KEYS = ["steps", "steps_this_run", "resumed_from", "resumed_by", "restarts", "stopped_early",
        "final_step", "final_loss", "skipped_steps", "measured", "predicted", "machine",
        "device_mismatch", "note"]
"""The summary's keys, in the order printed: the README's table of them lists these."""
PRED = {"step_time_s": 0.05, "tokens_per_s": 1e4, "memory_bytes": 1e6,
        "runtime": "autoplan-cpu", "error_band": 0.25}


def _history(first: int, n: int, step_s: float = 0.1) -> list[StepMetrics]:
    return [StepMetrics(step, 5.0, step_s, 1e4, 1 << 20, 0.5) for step in range(first, first + n)]


@pytest.fixture
def predicted_50ms(monkeypatch):
    monkeypatch.setattr(run_summary, "predicted", lambda plan: (dict(PRED), None))


def test_the_summary_has_its_documented_keys_and_says_each_note_once(predicted_50ms):
    """`note` and `prediction_note` held the same string whenever the run neither diverged nor
    lacked a step time: prediction_note existed only to carry the run record's predicted.note
    across to the launcher, which now rebuilds it from the summary."""
    plan = make_plan()
    summary = summarize(_history(1, 3), plan)
    assert list(summary) == KEYS
    assert list(summary["measured"]) == ["step_time_s", "tokens_per_s", "memory_bytes",
                                         "memory_rank"]
    band = band_note(0.1, 0.05, 0.25)
    assert summary["note"] == band
    again = json.loads(json.dumps(summary))  # as the launcher reads rank 0's summary file
    assert run_record(again, plan)["predicted"]["note"] == band
    assert (summary["restarts"], summary["resumed_by"], summary["stopped_early"]) == (0, None,
                                                                                     None)


def test_without_a_cost_model_the_run_record_still_says_why(monkeypatch):
    why = "cost model unavailable (ImportError: no numpy)"
    monkeypatch.setattr(run_summary, "predicted", lambda plan: (None, why))
    plan = make_plan()
    summary = json.loads(json.dumps(summarize(_history(1, 3), plan)))
    assert summary["predicted"] is None and summary["note"] == why
    assert run_record(summary, plan)["predicted"]["note"] == why


def test_a_restarted_run_says_it_was_restarted_and_from_where(predicted_50ms):
    """After kill -9 of a rank and a torchrun restart the summary read resumed_from 70 as if
    --resume had been given, with no restart count."""
    summary = summarize(_history(71, 80), make_plan(), resumed_step=70, resumed_by="restart",
                        restarts=1)
    assert (summary["resumed_from"], summary["resumed_by"], summary["restarts"]) == (
        70, "restart", 1)
    assert (summary["steps"], summary["steps_this_run"]) == (150, 80)
    out = io.StringIO()
    render_summary(Console(file=out, width=400), summary)
    assert ("restarts: 1 (torchrun restarted the ranks after a failure; measured over the steps "
            "after checkpoint step 70, which the last restart resumed from)") in out.getvalue()


class _Checkpoints:
    def __init__(self, step):
        self.step = step

    def load_newest(self, plan, spec, settings):
        return self.step


def _resume(monkeypatch, step, restart_count: str, **flags):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart_count)
    trainer = types.SimpleNamespace(step=0, optimizers=[], optim_cfg=None)
    args = argparse.Namespace(**{"resume": False, "elastic": False, "steps": 100,
                                 "metrics_file": None, **flags})
    return worker._resume(_Checkpoints(step), trainer, None, None, None, args), trainer.step


@pytest.mark.parametrize(("step", "restart_count", "flags", "expected"), [
    (70, "1", {}, ("restart", 70)),
    (70, "1", {"resume": True}, ("restart", 70)),  # --resume began the run, a restart this
    (40, "0", {"resume": True}, ("--resume", 40)),
    (40, "0", {"elastic": True, "resume": True}, ("elastic", 40)),
    (None, "1", {}, (None, 0)),  # restarted before any checkpoint: from step 0, nothing loaded
    (None, "0", {}, (None, 0)),  # no --resume: the folder is not even read
])
def test_resume_says_what_loaded_the_checkpoint(monkeypatch, step, restart_count, flags,
                                                expected):
    assert _resume(monkeypatch, step, restart_count, **flags) == expected


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_the_stop_flag_says_why_the_rank_stops(tmp_path, handlers):
    stop_file = tmp_path / "stop"
    flag = worker._StopFlag(str(stop_file), os.getpid())
    assert not flag.set and flag.reason is None
    stop_file.touch()
    assert flag.set and flag.reason == worker.STOP_FILE_REASON
    signalled = worker._StopFlag(str(stop_file), os.getpid())
    signal.raise_signal(signal.SIGTERM)  # its handler records it; the rank finishes its step
    signal.raise_signal(signal.SIGINT)
    assert signalled.set and signalled.reason == "SIGTERM"  # the first, over the stop file
    dead = worker._StopFlag(None, _reaped_pid())
    assert dead.set and dead.reason == "the launcher's exit"


def _reaped_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _fake_torchrun(summary: dict | None, signum: int, killed: bool = False):
    """run_supervised as it returns after a Ctrl-C: the ranks stopped after their step and
    rank 0 wrote its summary (none when they were killed)."""
    from autoplan.runtime.supervise import Outcome

    def run(cmd, env, stop_file, grace_s):
        if summary is not None:
            with open(os.path.join(os.path.dirname(stop_file), "summary.json"), "w") as f:
                json.dump(summary, f)
        return Outcome(returncode=-9 if killed else 0, signal=signum, killed=killed)

    return run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_run_prints_the_summary_of_its_steps_then_exits_128_plus_the_signal(
        tmp_path, capsys, monkeypatch, predicted_50ms, signum):
    """On Ctrl-C `train --format json` printed nothing on stdout (user test 34)."""
    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    ranks = summarize(_history(1, 2), make_plan("h8-2l"), stopped_early=worker.STOP_FILE_REASON)
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", _fake_torchrun(ranks, signum))
    code = main(["train", plan_path, "--steps", "5", "--format", "json"])
    out, err = capsys.readouterr()
    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    summary = json.loads(out)  # valid JSON, the whole of stdout
    assert list(summary) == KEYS
    assert summary["stopped_early"] == name and summary["final_step"] == 2
    assert err.strip().splitlines()[-1] == (
        f"autoplan train: error: stopped by {name} after step 2 (no --checkpoint-dir: nothing "
        "saved)")
    # the table says it too
    code = main(["train", plan_path, "--steps", "5", "--format", "table"])
    out, _ = capsys.readouterr()
    assert code == 128 + signum and f"stopped early by {name} after step 2" in out


def test_a_killed_run_has_no_summary_to_print(tmp_path, capsys, monkeypatch):
    """A second Ctrl-C kills the ranks before any wrote a summary: stdout stays empty (no
    half summary), and the error line says what was saved."""
    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised",
                        _fake_torchrun(None, signal.SIGINT, killed=True))
    code = main(["train", plan_path, "--steps", "5", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 130 and out == ""
    assert "stopped by SIGINT: killed torchrun and the ranks without a summary" in err
