"""Step metrics: fp16 loss scale and skipped steps reach the JSONL file and the summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from autoplan.runtime.metrics import MetricsSink, StepMetrics
from autoplan.runtime.summary import summarize
from tests.dist.parity import make_plan


def test_skipped_fp16_steps_are_logged(tmp_path):
    path = tmp_path / "m.jsonl"
    sink = MetricsSink(str(path), live=True)
    sink.record(StepMetrics(1, 5.5, 0.1, 100.0, 1, 0.7, loss_scale=65536.0))
    sink.record(StepMetrics(2, 5.4, 0.1, 100.0, 1, None, loss_scale=65536.0, skipped=True))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["loss_scale"], r["skipped"], r["grad_norm"]) for r in rows] == [
        (65536.0, False, 0.7), (65536.0, True, None)]
    summary = summarize(sink.history, make_plan())
    assert summary["skipped_steps"] == 1 and not math.isnan(summary["final_loss"])


def test_a_run_without_a_step_after_warm_up_measures_no_step_time(tmp_path):
    """--steps 1: the warm-up step was reported as the step time and calibrate fitted it."""
    from autoplan.calibrate import load_run
    from autoplan.errors import ConfigError
    from autoplan.runtime.summary import write_run_record

    plan = make_plan()
    sink = MetricsSink(None, live=False)
    sink.record(StepMetrics(1, 5.5, 0.9, 100.0, 1 << 20, 0.7))
    summary = summarize(sink.history, plan)
    assert summary["measured"]["step_time_s"] is None
    assert summary["measured"]["tokens_per_s"] is None
    assert "no step after its 1 warm-up step" in summary["note"]
    assert "--steps 2 or more" in summary["note"]
    path = tmp_path / "run.json"
    write_run_record(str(path), summary, plan)
    assert json.loads(path.read_text())["measured"]["step_time_s"] is None
    with pytest.raises(ConfigError) as info:
        load_run(path)
    assert info.value.field.endswith("measured.step_time_s")
    assert "two steps or more" in str(info.value)
    sink.record(StepMetrics(2, 5.4, 0.2, 100.0, 1 << 20, 0.7))
    assert summarize(sink.history, plan)["measured"]["step_time_s"] == 0.2


def test_summary_and_run_record_give_the_largest_ranks_peak(tmp_path):
    """Rank 0's figure was reported while the cost model prices the largest rank."""
    from autoplan.runtime.summary import run_record

    sink = MetricsSink(None, live=False)
    for step in (1, 2):
        sink.record(StepMetrics(step, 5.5, 0.1, 100.0, 300 << 20, 0.7))
    machine = {"device": "cpu", "device_type": "cpu", "backend": "gloo"}
    summary = summarize(sink.history, make_plan(pp=2), peak=(900 << 20, 1), machine=machine)
    assert (summary["measured"]["memory_bytes"], summary["measured"]["memory_rank"]) == (
        900 << 20, 1)
    record = run_record(summary, make_plan(pp=2))
    assert record["measured"]["peak_memory_bytes"] == 900 << 20
    assert record["measured"]["peak_memory_rank"] == 1
    assert record["machine"]["device"] == "cpu" and record["machine"]["backend"] == "gloo"


def _touch(n_bytes: int) -> bytearray:
    buf = bytearray(n_bytes)
    buf[::4096] = b"\x01" * len(range(0, n_bytes, 4096))  # make the pages resident
    return buf


@pytest.mark.parametrize("resettable", [True, False])
def test_training_peak_leaves_out_memory_held_between_steps(monkeypatch, resettable):
    """A checkpoint save between steps raised every later step's CPU peak (the process's
    lifetime maximum RSS) by what the save held."""
    from autoplan.runtime import metrics

    if not Path(metrics._CLEAR_REFS).exists() or not Path(metrics._STATUS).exists():
        pytest.skip("no /proc/self/clear_refs: the peak RSS cannot be reset here")
    if not resettable:
        monkeypatch.setattr(metrics, "_CLEAR_REFS", "/nonexistent/clear_refs")
    cpu = torch.device("cpu")
    peak = metrics.TrainingPeak(cpu)
    peak.start_step()
    first = peak.end_step()
    spike = 256 << 20
    held = _touch(spike)  # what a save holds, freed before the next step
    del held
    peak.saved()
    peak.start_step()
    second = peak.end_step()
    if resettable:
        assert second < first + spike // 2 and peak.bytes == max(first, second)
    else:  # the lifetime peak from here on (second): only the steps before the save count
        assert peak.bytes == first


def test_the_summary_says_which_runtime_it_priced_and_how_sure():
    """Every estimate carries its runtime and error band; train's measured-vs-predicted
    summary had neither."""
    from rich.console import Console

    from autoplan.cost.estimate import estimate_plan
    from autoplan.runtime.summary import render_summary

    plan = make_plan()
    sink = MetricsSink(None, live=False)
    for step in (1, 2):
        sink.record(StepMetrics(step, 5.5, 0.1, 100.0, 300 << 20, 0.7))
    summary = summarize(sink.history, plan)
    est = estimate_plan(plan)
    assert summary["predicted"]["runtime"] == est.runtime == "autoplan-cpu"
    assert summary["predicted"]["error_band"] == pytest.approx(est.error_band)
    console = Console(width=120, record=True)
    render_summary(console, summary)
    assert f"predicted (autoplan-cpu, step ±{est.error_band:.0%})" in console.export_text()
