"""The train summary's title (user test 37, finding 17): a resumed run's title counts its steps
from step 0, as the JSON's `steps` does, and says the checkpoint step it resumed from, as the
JSON's `resumed_from` does."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from autoplan.runtime import summary as run_summary
from autoplan.runtime.metrics import StepMetrics
from autoplan.runtime.summary import render_summary, summarize, summary_title
from tests.dist.parity import make_plan

PRED = {"step_time_s": 0.05, "tokens_per_s": 1e4, "memory_bytes": 1e6,
        "runtime": "autoplan-cpu", "error_band": 0.25}


def _history(first: int, n: int) -> list[StepMetrics]:
    return [StepMetrics(step, 4.5, 0.05, 1e4, 1 << 20, 0.5) for step in range(first, first + n)]


@pytest.fixture(autouse=True)
def _priced(monkeypatch):
    monkeypatch.setattr(run_summary, "predicted", lambda plan: (dict(PRED), None))


def _rendered(summary) -> str:
    out = io.StringIO()
    render_summary(Console(file=out, width=400), summary)
    return out.getvalue()


@pytest.mark.parametrize("resumed_by", ["--resume", "restart", "elastic"])
def test_a_resumed_run_says_from_which_step_in_the_title_and_the_json_agrees(resumed_by):
    summary = json.loads(json.dumps(summarize(_history(212, 89), make_plan(), resumed_step=211,
                                              resumed_by=resumed_by)))
    assert (summary["steps"], summary["resumed_from"], summary["steps_this_run"]) == (300, 211,
                                                                                      89)
    title = "autoplan train: 300 steps (resumed from step 211), final loss 4.5000"
    assert summary_title(summary) == title
    assert title in _rendered(summary)


def test_a_fresh_run_says_no_resume():
    summary = summarize(_history(1, 20), make_plan())
    assert summary["resumed_from"] == 0
    assert summary_title(summary) == "autoplan train: 20 steps, final loss 4.5000"
    assert "resumed" not in _rendered(summary)


def test_a_run_with_no_loss_keeps_the_bare_title():
    summary = summarize([], make_plan(), resumed_step=211, resumed_by="--resume")
    assert summary_title(summary) == "autoplan train"
