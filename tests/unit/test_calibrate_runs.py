"""calibrate_runs.plan_key tells plans apart as calibrate counts them, and `autoplan.calibrate`
still hands out every public name of the modules it was split into (the importers' path)."""

from __future__ import annotations

import autoplan.calibrate as calibrate
from autoplan import (
    calibrate_devices,
    calibrate_factors,
    calibrate_identify,
    calibrate_pricing,
    calibrate_runs,
)
from autoplan.calibrate_runs import plan_key
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
