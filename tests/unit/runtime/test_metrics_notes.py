"""The summary's note when the measured step time is outside the prediction's error band (in
the table, the JSON and the run record), the host's load in the run record, and the warning
when a resumed run's --metrics-file misses the steps trained without it."""

from __future__ import annotations

import io
import json
import logging

import pytest
from rich.console import Console

from autoplan.runtime import summary as run_summary
from autoplan.runtime.machine import host_load, load_average
from autoplan.runtime.metrics import MetricsSink, StepMetrics
from autoplan.runtime.summary import render_summary, run_record, summarize
from autoplan.runtime.summary_notes import band_note
from tests.dist.parity import make_plan

QUIET = {"cpu_count": 8, "load_avg_start": [0.5, 0.4, 0.3], "load_avg_end": [2.1, 1.0, 0.5]}
BUSY = {"cpu_count": 2, "load_avg_start": [3.5, 3.0, 2.0], "load_avg_end": [4.25, 3.1, 2.0]}


def test_a_step_inside_the_band_has_no_note():
    assert band_note(0.06, 0.05, 0.25) is None  # 1.2x
    assert band_note(0.0625, 0.05, 0.25) is None  # on the edge
    assert band_note(0.04, 0.05, 0.25) is None  # 0.8x
    assert band_note(None, 0.05, 0.25) is None and band_note(0.1, None, 0.25) is None
    assert band_note(0.1, 0.0, 0.25) is None and band_note(0.1, 0.05, None) is None


def test_a_step_outside_the_band_says_by_how_much():
    slow = band_note(0.1, 0.05, 0.25, QUIET)
    assert slow == ("the measured step time 0.1 s is 2.00x the predicted 0.05 s (100% slower), "
                    "outside the prediction's ±25% error band (0.0375-0.0625 s); the host's load "
                    "average was 0.50 at the start and 2.10 at the end, on 8 CPUs (this run's "
                    "ranks count in it)")
    fast = band_note(0.02, 0.05, 0.25)
    assert fast is not None and "0.40x the predicted" in fast and "(60% faster)" in fast
    assert "load" not in fast  # not recorded: not guessed


def test_a_busy_host_is_named_as_one():
    note = band_note(0.1, 0.05, 0.25, BUSY)
    assert note is not None and note.endswith(
        "3.50 at the start and 4.25 at the end, on 2 CPUs (this run's ranks count in it): a busy "
        "host slows every step")


def test_a_host_loaded_only_by_the_runs_own_ranks_is_not_busy():
    """calibrate's rule (calibrate_runs.HostLoad, user test 38): the end's load less the run's
    ranks, or the start's, above the CPUs. 4 ranks on 2 quiet CPUs end at load 4.2, which is
    their own; without the ranks counted out the same figures read busy."""
    own = {"cpu_count": 2, "load_avg_start": [0.3, 0.2, 0.1], "load_avg_end": [4.2, 2.0, 1.0]}
    quiet = band_note(0.1, 0.05, 0.25, own, ranks=4)
    assert quiet is not None and not quiet.endswith("a busy host slows every step")
    assert str(band_note(0.1, 0.05, 0.25, own, ranks=0)).endswith("a busy host slows every step")


def _history(step_s: float) -> list[StepMetrics]:
    return [StepMetrics(step, 5.0, step_s, 1e4, 1 << 20, 0.5) for step in (1, 2, 3)]


@pytest.fixture
def predicted_50ms(monkeypatch):
    pred = {"step_time_s": 0.05, "tokens_per_s": 1e4, "memory_bytes": 1e6,
            "runtime": "autoplan-cpu", "error_band": 0.25}
    monkeypatch.setattr(run_summary, "predicted", lambda plan: (dict(pred), None))


def test_the_note_reaches_the_json_the_table_and_the_run_record(predicted_50ms, tmp_path):
    from autoplan.calibrate import load_run

    plan = make_plan()
    machine = {"device": "cpu", "device_type": "cpu", "backend": "gloo", **BUSY}
    summary = summarize(_history(0.1), plan, machine=machine)
    assert summary["note"] == band_note(0.1, 0.05, 0.25, machine)
    out = io.StringIO()
    render_summary(Console(file=out, width=400), summary)
    assert f"note: {summary['note']}" in out.getvalue()
    record = run_record(summary, plan)
    assert record["predicted"]["note"] == summary["note"]
    assert record["predicted"]["error_band"] == 0.25
    assert {k: record["machine"][k] for k in BUSY} == BUSY
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    assert load_run(path).measured.step_time_s == pytest.approx(0.1)  # calibrate still reads it
    assert summarize(_history(0.055), plan, machine=machine)["note"] is None  # inside the band


def test_a_device_mismatch_is_noted_instead(predicted_50ms):
    summary = summarize(_history(0.1), make_plan(), device_mismatch="another device")
    assert summary["note"] == "another device"  # not comparable: no band verdict


def test_the_host_load_is_recorded_as_measured():
    avg = load_average()
    assert avg is not None and len(avg) == 3 and all(x >= 0 for x in avg)
    load = host_load([1.0, 2.0, 3.0], avg)
    assert load["cpu_count"] >= 1 and load["load_avg_start"] == [1.0, 2.0, 3.0]
    assert load["load_avg_end"] == avg


def _records(steps) -> str:
    return "".join(json.dumps({"step": s, "loss": 5.0, "step_time_s": 0.1, "tokens_per_s": 1.0,
                               "peak_memory_bytes": 1, "grad_norm": 0.5}) + "\n" for s in steps)


def _gap_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not in it" in r.getMessage()]


def test_a_metrics_file_that_stops_before_the_resumed_step_is_warned_once(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    path.write_text(_records(range(1, 51)))
    with caplog.at_level(logging.WARNING, logger="autoplan.runtime.metrics"):
        MetricsSink(str(path), live=False, resumed_step=60)
        assert _gap_warnings(caplog) == [
            f"--metrics-file {path} ends at step 50 but the run resumes at step 60; steps 51-60 "
            "are not in it"]
        caplog.clear()
        MetricsSink(str(path), live=False, resumed_step=60, warn_gap=False)  # a restart
        assert _gap_warnings(caplog) == []
        MetricsSink(str(path), live=False, resumed_step=51)
        assert _gap_warnings(caplog) == [
            f"--metrics-file {path} ends at step 50 but the run resumes at step 51; step 51 is "
            "not in it"]
        caplog.clear()
        MetricsSink(str(path), live=False, resumed_step=40)  # ahead: cut to 40, nothing missing
        MetricsSink(str(tmp_path / "new.jsonl"), live=False, resumed_step=60)  # a new file
        assert _gap_warnings(caplog) == []
    assert path.read_text() == _records(range(1, 41))


def test_the_run_records_predicted_note_holds_only_what_concerns_the_prediction(predicted_50ms):
    """predicted.note held the whole summary note: a diverged loss or an unmeasured step
    time, which say nothing of the prediction, read as notes on it (review)."""
    plan = make_plan()
    history = _history(0.1)
    history[-1] = StepMetrics(3, float("nan"), 0.1, 1e4, 1 << 20, None)
    summary = summarize(history, plan)
    band = band_note(0.1, 0.05, 0.25)
    assert band is not None and summary["note"].startswith(f"{band}; the loss is not finite")
    assert run_record(summary, plan)["predicted"]["note"] == band
    mismatch = summarize(history, plan, device_mismatch="another device")
    assert mismatch["note"].startswith("another device; the loss is not finite")
    assert run_record(mismatch, plan)["predicted"]["note"] == "another device"
    unmeasured = summarize(_history(0.1)[:1], plan)  # only the warm-up step: no step time
    assert "step time not measured" in unmeasured["note"]
    assert run_record(unmeasured, plan)["predicted"]["note"] is None


def test_a_band_past_100_percent_has_no_negative_low_end() -> None:
    """fp8 MoE plans carry a +-131% band (their validation runs missed by up to 80%): the range
    a note prints starts at zero, not at a negative step time."""
    from autoplan.runtime.summary_notes import band_note

    note = band_note(3.0, 1.0, 1.3061)
    assert note is not None and "(0-2.306 s)" in note and "-0.3" not in note
