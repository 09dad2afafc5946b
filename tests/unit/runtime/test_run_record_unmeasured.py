"""A run a signal stopped within its warm-up (before a second step) writes a run record whose
measured.step_time_s is null, which `autoplan calibrate` refuses: the launcher says the record
holds no measured step (autoplan/runtime/launch.py, the signal path and the plain one)."""

from __future__ import annotations

import json
import signal

import pytest

from autoplan.calibrate_runs import load_run
from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan_files import save_plan
from autoplan.runtime import worker
from autoplan.runtime.summary import summarize
from tests.dist.parity import make_plan

from .test_last_step_stop import _fake_torchrun, _history, predicted_50ms  # noqa: F401


@pytest.mark.parametrize(("trained", "unmeasured"), [(1, True), (3, False)])
def test_a_record_without_a_measured_step_is_said_to_be_none_calibrate_reads(
        tmp_path, capsys, caplog, monkeypatch, predicted_50ms, trained, unmeasured):  # noqa: F811
    plan_path = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    ranks = summarize(_history(trained), make_plan("h8-2l"),
                      stopped_early=worker.STOP_FILE_REASON, steps=5)
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised",
                        _fake_torchrun(ranks, signal.SIGTERM))
    record = tmp_path / "run.json"
    code = main(["train", plan_path, "--steps", "5", "--run-record", str(record),
                 "--format", "json"])
    capsys.readouterr()
    assert code == 143 and record.exists()
    null = json.loads(record.read_text())["measured"]["step_time_s"] is None
    assert null is unmeasured
    said = f"--run-record {record} holds no measured step" in caplog.text
    assert said is unmeasured
    if unmeasured:  # what the warning says of calibrate holds
        assert "`autoplan calibrate` refuses it" in caplog.text
        with pytest.raises(ConfigError, match="measured.step_time_s"):
            load_run(record)
