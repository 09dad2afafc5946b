"""Review fixes in runtime/metrics.py: the shape check that lets --resume cut only a run's own
metrics file, the --steps a resumed run without a measured step is told, and a run record
whose path was taken during the run going to a numbered sibling."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from autoplan.runtime.metrics import MetricsSink, StepMetrics
from autoplan.runtime.summary import summarize, write_run_record
from tests.dist.parity import make_plan

RECORD = asdict(StepMetrics(3, 5.1, 0.05, 1e4, 1 << 20, None, loss_scale=1024.0, skipped=True))


def test_step_records_are_told_from_other_json():
    from autoplan.runtime.metrics import is_step_record

    assert is_step_record(RECORD)
    old = {k: v for k, v in RECORD.items() if k not in ("loss_scale", "skipped")}
    assert is_step_record(old)  # written before fp16 loss scaling
    assert not is_step_record({"step": 3, "loss": 5.1})
    assert not is_step_record({**RECORD, "note": "x"})
    assert not is_step_record({**RECORD, "step": True})
    assert not is_step_record({**RECORD, "step": 0})
    assert not is_step_record({**RECORD, "loss": "5.1"})
    assert not is_step_record([RECORD])


def test_metrics_file_problem_names_the_first_foreign_line(tmp_path):
    from autoplan.runtime.metrics import metrics_file_problem

    path = tmp_path / "m.jsonl"
    line = json.dumps(RECORD) + "\n"
    for text, want in [
        ("", None),
        (line * 3, None),
        (line + "\n" + line, None),  # a blank line is nothing to lose
        (line + '{"step": 4, "lo', None),  # torn by a kill
        (line + '{"st', None),
        (line + "plan: x\n", "line 2 is not a step record: 'plan: x'"),
        ("schema_version: 1\n", "line 1 is not a step record: 'schema_version: 1'"),
        (line + "tail", "line 2 is not a step record: 'tail'"),
    ]:
        path.write_text(text)
        assert metrics_file_problem(path) == want, text
    path.write_bytes(b"\x00\xff\x10binary\n")
    assert metrics_file_problem(path).startswith("line 1 is not a step record")


@pytest.mark.parametrize(("resumed", "steps", "needle"), [
    (6, [7], "this run trained 1 step after resuming at step 6: --steps 8 or more"),
    (0, [1], "this run trained 1 step: --steps 2 or more"),
])
def test_an_unmeasured_run_is_told_the_steps_that_measure_one(resumed, steps, needle):
    """A resumed run with one new step was told "(run at least 2 steps)" after --steps 7."""
    sink = MetricsSink(None, live=False, resumed_step=resumed)
    for s in steps:
        sink.record(StepMetrics(s, 5.0, 0.05, 1e4, 1 << 20, 0.5))
    summary = summarize(sink.history, make_plan(), resumed_step=resumed)
    assert summary["measured"]["step_time_s"] is None
    assert "no step after its 1 warm-up step" in summary["note"]
    assert needle in summary["note"], summary["note"]
    assert "run at least" not in summary["note"]
    sink.record(StepMetrics(steps[-1] + 1, 5.0, 0.07, 1e4, 1 << 20, 0.5))
    again = summarize(sink.history, make_plan(), resumed_step=resumed)
    assert again["measured"]["step_time_s"] == 0.07 and "warm-up" not in (again["note"] or "")


def test_a_run_stopped_within_its_warm_up_is_told_to_resume_not_to_raise_steps():
    """Ctrl-C after step 1 of --steps 200 said "--steps 2 or more measures one" (user test
    35): the steps were enough, the signal stopped it."""
    sink = MetricsSink(None, live=False)
    sink.record(StepMetrics(1, 5.0, 0.05, 1e4, 1 << 20, 0.5))
    summary = summarize(sink.history, make_plan(), stopped_early="the launcher's stop file")
    assert summary["note"] == (
        "step time not measured: the run was stopped within its 1 warm-up step (this run "
        "trained 1 step); resume it (--resume) to measure one")
    assert "--steps 2 or more measures one" in summarize(sink.history, make_plan())["note"]


def test_a_taken_run_record_path_gets_numbered_siblings(tmp_path, caplog):
    plan = make_plan()
    sink = MetricsSink(None, live=False)
    for step in (1, 2, 3):
        sink.record(StepMetrics(step, 1.0, 0.2, 10.0, 3 << 20, 0.5))
    summary = summarize(sink.history, plan)
    path = tmp_path / "run.json"
    assert write_run_record(str(path), summary, plan) == path
    first = path.read_bytes()
    with caplog.at_level("WARNING"):
        assert write_run_record(str(path), summary, plan) == tmp_path / "run.1.json"
        assert write_run_record(str(path), summary, plan) == tmp_path / "run.2.json"
    assert path.read_bytes() == first
    assert json.loads((tmp_path / "run.2.json").read_text())["measured"]["steps"] == 3
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 2 and notes[0].startswith("--run-record: ") and "run.1.json" in notes[0]
