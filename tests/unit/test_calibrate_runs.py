"""calibrate_runs.plan_key tells plans apart as calibrate counts them, busy_host names a run
measured beside other processes' load (and calibrate warns of it), and `autoplan.calibrate`
still hands out every public name of the modules it was split into (the importers' path)."""

from __future__ import annotations

import json
import re

import pytest

import autoplan.calibrate as calibrate
from autoplan import (
    calibrate_devices,
    calibrate_factors,
    calibrate_identify,
    calibrate_pricing,
    calibrate_runs,
)
from autoplan.calibrate_runs import busy_host, load_run, plan_key
from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import plan_from_dict

PLAN = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
        "precision": "fp32", "attention": "eager",
        "batch": {"micro_batch_size": 2, "global_batch_size": 16}, "parallel": {"dp": 2}}


def test_a_plan_is_one_plan_whatever_it_was_predicted_at() -> None:
    plan = plan_from_dict(PLAN)
    predicted = plan.replace(predicted={"step_time_s": 0.5, "memory_total_bytes": 1e9})
    assert plan_key(predicted) == plan_key(plan)
    other = plan_from_dict({**PLAN, "parallel": {"tp": 2}})
    assert plan_key(other) != plan_key(plan)
    micro = plan_from_dict({**PLAN, "batch": {"micro_batch_size": 4, "global_batch_size": 16}})
    assert plan_key(micro) != plan_key(plan)


def test_autoplan_calibrate_exports_the_parts_own_objects() -> None:
    parts = (calibrate_runs, calibrate_devices, calibrate_factors, calibrate_pricing,
             calibrate_identify)
    for name in calibrate.__all__:
        value = getattr(calibrate, name)  # AttributeError: __all__ names a name it lacks
        for part in parts:  # its home, and any part that imports it from there
            if hasattr(part, name):
                assert getattr(part, name) is value, (name, part.__name__)
    # the names other modules and tests import from autoplan.calibrate
    for name in ("load_run", "check_runs", "device_model", "device_token", "RunRecord",
                 "calibrate", "Calibration", "StepPricer", "apply_factors", "identity",
                 "active_factors", "left_factors", "step_errors", "UNFELT",
                 "MIN_HELD_OUT_PLANS", "profile_file"):
        assert name in calibrate.__all__, name


def _record(tmp_path, name: str, machine: dict, dp: int = 4) -> str:
    plan = {**PLAN, "cluster": {"profile": "cpu-gloo", "num_gpus": dp}, "parallel": {"dp": dp}}
    path = tmp_path / name
    path.write_text(json.dumps({"schema_version": 1, "plan": plan, "profile": "cpu-gloo",
                                "measured": {"step_time_s": 0.5},
                                "machine": {"device": "cpu", **machine}}))
    return str(path)


BUSY = {"cpu_count": 2, "load_avg_start": [3.12, 2.5, 2.0], "load_avg_end": [4.66, 3.0, 2.2]}
"""User test 38's records: other helpers kept 2 CPUs busy before its 4 ranks started."""
QUIET = {"cpu_count": 2, "load_avg_start": [0.3, 0.2, 0.1], "load_avg_end": [4.1, 1.5, 0.6]}
"""A quiet host whose end load is the run's own 4 ranks (which the cost model prices)."""


def test_a_run_on_a_host_other_processes_kept_busy_is_named(tmp_path) -> None:
    busy = load_run(_record(tmp_path, "busy.json", BUSY))
    line = busy_host(busy)
    assert line is not None and line.startswith(f"{busy.source} ran at load 3.12 -> 4.66 on "
                                                 "2 CPUs, 3.12 of it other processes'"), line
    assert "re-measure on a quiet host" in line
    assert busy_host(load_run(_record(tmp_path, "quiet.json", QUIET))) is None
    # no load kept (tune's records, older train records): nothing to say
    assert load_run(_record(tmp_path, "old.json", {})).host_load is None
    # the end alone, past its ranks by more than the CPUs
    late = load_run(_record(tmp_path, "late.json", {**QUIET, "load_avg_end": [6.5, 2, 1]}))
    assert late.host_load is not None and late.host_load.others == pytest.approx(2.5)
    assert busy_host(late) is not None


@pytest.mark.parametrize(("key", "value"), [
    ("cpu_count", 0), ("cpu_count", "2"), ("load_avg_start", "high"),
    ("load_avg_end", [-1.0, 0, 0]), ("load_avg_end", []),
])
def test_a_malformed_load_is_refused_naming_the_field(tmp_path, key, value) -> None:
    path = _record(tmp_path, "bad.json", {**BUSY, key: value})
    with pytest.raises(ConfigError, match=f"RUN {re.escape(path)}: machine.{key}: got"):
        load_run(path)


def test_calibrate_warns_once_per_busy_run_and_keeps_it_in_the_json(tmp_path, capsys) -> None:
    busy, quiet = _record(tmp_path, "busy.json", BUSY), _record(tmp_path, "quiet.json", QUIET)
    assert main(["calibrate", busy, quiet, "--profile", "cpu-gloo", "--trials", "4",
                 "--out", str(tmp_path / "fitted.yaml"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    warned = [ln for ln in err.splitlines() if " ran at load " in ln]
    assert warned == [f"autoplan calibrate: warning: {busy} ran at load 3.12 -> 4.66 on 2 CPUs, "
                      "3.12 of it other processes' (its 4 ranks left out), more than the CPUs: "
                      "the fit takes the load for the machine's speed; re-measure on a quiet "
                      "host"], err
    rows = {r["run"]: r["busy_host"] for r in json.loads(out)["per_run"]}
    assert rows[busy] == warned[0].removeprefix("autoplan calibrate: warning: ")
    assert rows[quiet] is None
