"""calibrate's errors are predicted / measured - 1 and `train` shows measured / predicted: one
run 1.25x slower than predicted read `1.25x ... (25% slower)` in train and `error before -20.1%`
in calibrate with nothing saying which way either went (user test 34, finding 12). Both keep
their meaning; calibrate's table says what its sign means, and the example it gives is true of
both conventions."""

from __future__ import annotations

import json

from autoplan.calibrate_cli import ERROR_LEGEND
from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict
from autoplan.runtime.summary_notes import band_note

PLAN = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
        "precision": "fp32", "attention": "eager", "parallel": {"dp": 2},
        "batch": {"micro_batch_size": 2, "global_batch_size": 16}}


def test_a_run_slower_than_predicted_is_a_negative_error_and_the_table_says_so(tmp_path,
                                                                                capsys) -> None:
    plan = plan_from_dict(PLAN)
    predicted = estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 2)).step_time_s
    measured = predicted * 1.25  # ran 25% slower than predicted
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"plan": plan_to_dict(plan), "profile": "cpu-gloo",
                               "measured": {"step_time_s": measured}}))
    assert main(["calibrate", str(run), "--profile", "cpu-gloo", "--out",
                 str(tmp_path / "fitted.yaml"), "--trials", "5", "--format", "table"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    row = next(line for line in out.split("│ run.json")[1:])
    assert row.split("│")[2].strip() == "-20.0%", row  # error before: 1 / 1.25 - 1
    assert ERROR_LEGEND in out
    assert "predicted / measured - 1: -20% is a step predicted 20% shorter than it ran" in out
    # train's note for the same miss is the ratio the legend quotes
    note = band_note(measured, predicted, 0.1)
    assert note is not None and "1.25x the predicted" in note and "(25% slower)" in note
    assert "measured / predicted 1.25x, 25% slower" in ERROR_LEGEND
