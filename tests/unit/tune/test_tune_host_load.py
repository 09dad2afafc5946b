"""A tune's trials keep the host's load as `autoplan train` records it (machine.cpu_count,
load_avg_start and load_avg_end), so `autoplan calibrate` over tune's run records, and tune's
own calibration, warn of a trial measured on a host other processes kept busy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan import plan_from_dict
from autoplan.tune.cli import _calibrate
from autoplan.tune.study import TuneConfig, make_candidates, run_record, run_tune
from autoplan.tune.table import short_plan

STAND_IN = Path(__file__).with_name("stand_in_train.py")
COMMAND = (sys.executable, str(STAND_IN), "{plan}", "{metrics}", "{steps}")
CPUS = os.cpu_count() or 1
BUSY = (CPUS + 1.5, CPUS + 1.0, CPUS + 0.5)
"""Other processes keep 1.5 more tasks runnable than the host has CPUs, before and after the
trial (the end less the trial's 2 ranks still over the CPUs only from the start's)."""
QUIET = (0.25, 0.2, 0.1)


def _plan(mbs: int):
    return plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2}, "zero_stage": 1, "precision": "fp32",
                           "attention": "eager",
                           "batch": {"micro_batch_size": mbs, "global_batch_size": 16}})


def _tune(tmp_path: Path, monkeypatch, load: tuple[float, ...]):
    """Two real trials of the stand-in trainer, the OS's load average reading `load`
    (os.getloadavg: what runtime/machine.load_average reads for train and tune alike)."""
    monkeypatch.setattr(os, "getloadavg", lambda: load)
    cands = make_candidates([(_plan(2), "model rank 1"), (_plan(1), "model rank 2")])
    result = run_tune(cands, TuneConfig(steps=4, budget_s=60, trial_timeout_s=20,
                                        command=COMMAND), tmp_path)
    assert [t["status"] for t in result.trials] == ["complete", "complete"]
    return cands, result.trials


def _records(tmp_path: Path, cands, trials) -> list[str]:
    paths = []
    for cand, trial in zip(cands, trials, strict=True):
        path = tmp_path / f"{cand.key}.json"
        path.write_text(json.dumps(run_record(cand, trial, "cpu-gloo", "cpu")))
        paths.append(str(path))
    return paths


def _calibrate_cli(paths: list[str], tmp_path: Path, capsys) -> tuple[list[str], dict]:
    assert main(["calibrate", *paths, "--profile", "cpu-gloo", "--trials", "4",
                 "--out", str(tmp_path / "fitted.yaml"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    return [ln for ln in err.splitlines() if " ran at load " in ln], json.loads(out)


def test_calibrate_warns_of_tune_trials_run_on_a_busy_host(tmp_path, monkeypatch,
                                                           capsys) -> None:
    cands, trials = _tune(tmp_path / "tune", monkeypatch, BUSY)
    assert trials[0]["cpu_count"] == CPUS
    assert trials[0]["load_avg_start"] == trials[0]["load_avg_end"] == list(BUSY)
    paths = _records(tmp_path, cands, trials)
    record = json.loads(Path(paths[0]).read_text())
    assert record["machine"] == {"device": "cpu", "cpu_count": CPUS,
                                 "load_avg_start": list(BUSY), "load_avg_end": list(BUSY)}
    warned, data = _calibrate_cli(paths, tmp_path, capsys)
    start = f"{BUSY[0]:.2f}"
    assert warned == [f"autoplan calibrate: warning: {p} ran at load {start} -> {start} on "
                      f"{CPUS} CPUs, {start} of it other processes' (its 2 ranks left out), "
                      "more than the CPUs: the fit takes the load for the machine's speed; "
                      "re-measure on a quiet host" for p in paths]
    assert all(r["busy_host"] for r in data["per_run"])


def test_calibrate_is_silent_over_tune_trials_on_a_quiet_host(tmp_path, monkeypatch,
                                                              capsys) -> None:
    cands, trials = _tune(tmp_path / "tune", monkeypatch, QUIET)
    warned, data = _calibrate_cli(_records(tmp_path, cands, trials), tmp_path, capsys)
    assert warned == []
    assert [r["busy_host"] for r in data["per_run"]] == [None, None]


@pytest.mark.parametrize(("load", "busy"), [(BUSY, True), (QUIET, False)])
def test_tunes_own_calibration_warns_naming_the_trial(tmp_path, monkeypatch, capsys, load,
                                                      busy) -> None:
    cands, trials = _tune(tmp_path / "tune", monkeypatch, load)
    capsys.readouterr()
    calib = _calibrate(trials, {c.key: c for c in cands}, "cpu-gloo", "cpu", tmp_path)
    assert calib is not None
    warned = [ln for ln in capsys.readouterr().err.splitlines() if " ran at load " in ln]
    want = [f"autoplan tune: warning: the trial of {c.source} ({short_plan(c.plan)}) ran at "
            f"load {load[0]:.2f} -> {load[0]:.2f} on {CPUS} CPUs" for c in cands]
    assert [ln[:len(w)] for ln, w in zip(warned, want, strict=False)] == (want if busy else [])
    assert len(warned) == (2 if busy else 0)


def test_a_trial_without_a_load_reading_writes_the_record_as_before(tmp_path, monkeypatch):
    """Where the OS has no load average (os.getloadavg raises OSError), the record keeps only
    machine.device, which calibrate reads as no load (no warning)."""
    def no_load():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", no_load)
    cands = make_candidates([(_plan(2), "model rank 1")])
    result = run_tune(cands, TuneConfig(steps=3, budget_s=60, trial_timeout_s=20,
                                        command=COMMAND), tmp_path)
    trial = result.trials[0]
    assert trial["status"] == "complete" and trial["load_avg_start"] is None
    assert run_record(cands[0], trial, "cpu-gloo", "cpu")["machine"] == {"device": "cpu"}
