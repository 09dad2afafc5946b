"""Step metrics: fp16 loss scale and skipped steps reach the JSONL file and the summary."""

from __future__ import annotations

import json
import math

from autoplan.runtime.metrics import MetricsSink, StepMetrics, summarize
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
