"""`autoplan calibrate` fits no more factors than the runs have different plans, and with three
or more predicts each plan from a fit to the others (leave-one-plan-out) beside the in-sample
error; its fast pricer prices as estimate_plan does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.calibrate import (
    Calibration,
    StepPricer,
    apply_factors,
    calibrate,
    identity,
    load_run,
    step_errors,
)
from autoplan.calibrate_cli import warn_overfit
from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict

PLANS = [  # one cpu-gloo node: tp with sp, pp, ZeRO-3, full recompute, bf16, flash attention
    {"parallel": {"dp": 2}}, {"parallel": {"tp": 2}, "sequence_parallel": True},
    {"parallel": {"pp": 2}}, {"parallel": {"dp": 4}, "zero_stage": 3},
    {"parallel": {"dp": 2}, "recompute": {"policy": "full"}},
    {"parallel": {"dp": 2}, "precision": "bf16", "attention": "flash"},
]


def _runs(tmp_path: Path, truth, plans=PLANS, scale=None) -> list[Path]:
    """Run records of `plans` measured at `truth`'s prediction (times scale[i] if given)."""
    paths = []
    for i, extra in enumerate(plans):
        par = extra["parallel"]
        n = par.get("dp", 1) * par.get("tp", 1) * par.get("pp", 1)
        plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": n},
                               "precision": "fp32", "attention": "eager",
                               "batch": {"micro_batch_size": 2, "global_batch_size": 16},
                               **extra})
        step = estimate_plan(plan, ClusterSpec(truth, n)).step_time_s * (scale or {}).get(i, 1)
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"plan": plan_to_dict(plan), "profile": "cpu-gloo",
                                    "measured": {"step_time_s": step}}))
        paths.append(path)
    return paths


def test_the_fit_s_pricer_prices_as_estimate_plan(tmp_path) -> None:
    """The fit prices the runs as one table per model, precision and attention: the errors it
    minimises are step_errors' (estimate_plan's, one plan at a time) on any profile."""
    base = load_profile("cpu-gloo")
    runs = [load_run(p) for p in _runs(tmp_path, base)]
    price = StepPricer(runs, base)
    for factors in (identity(base), dict(identity(base), compute=0.3, overlap=0.9,
                                         collective_tables=4.0, host_overheads=2.0)):
        profile = apply_factors(base, factors)
        assert price(profile) == pytest.approx(step_errors(runs, profile), rel=1e-12, abs=1e-12)


def test_each_plan_is_predicted_by_a_fit_to_the_others(tmp_path) -> None:
    """Runs of a machine half as fast in compute as the profile, one of them measured 1.6x
    slower still (a plan the others cannot explain): a fit to the other plans predicts that
    plan as the machine runs it (1/1.6 - 1 = -37.5%), and each run's held-out error is its
    error under the fit that never saw its plan."""
    base = load_profile("cpu-gloo")
    truth = apply_factors(base, dict(identity(base), compute=0.5))
    runs = [load_run(p) for p in _runs(tmp_path, truth, PLANS[:4], scale={0: 1.6})]
    result = calibrate(runs, base, trials=40, seed=0, held_out=True)
    held = result.step_errors_held_out
    assert held is not None and len(held) == len(runs)
    assert held[0] == pytest.approx(1 / 1.6 - 1, abs=0.05)
    for i, run in enumerate(runs):
        others = calibrate(runs[:i] + runs[i + 1:], base, trials=40, seed=0)
        assert held[i] == pytest.approx(step_errors([run], others.profile)[0], rel=1e-9)
    assert result.summary()["step_time_mape_held_out"] == pytest.approx(
        sum(map(abs, held)) / len(held))
    # two different plans hold none out
    two = calibrate(runs[:2], base, trials=10, seed=0, held_out=True)
    assert two.step_errors_held_out is None and two.summary()["step_time_mape_held_out"] is None


def test_the_cli_shows_the_held_out_error_beside_the_in_sample_one(tmp_path, capsys) -> None:
    base = load_profile("cpu-gloo")
    paths = _runs(tmp_path, apply_factors(base, dict(identity(base), compute=0.5)), PLANS[:3])
    assert main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out",
                 str(tmp_path / "fitted.yaml"), "--trials", "10", "--format", "table"]) == 0
    captured = capsys.readouterr()
    out = " ".join(captured.out.split())
    header = next(line for line in captured.out.splitlines() if "error after" in line)
    assert header.rstrip(" ┃").endswith("held out")
    assert "on each plan left out of the fit (leave-one-plan-out)" in out
    assert "3 different plans identify 3 factors: fitted the 3 that govern most" in out
    assert "fitted to alone" not in captured.err


def _calibration(before: float, after: float, held: float | None) -> Calibration:
    profile = load_profile("cpu-gloo")
    return Calibration(profile=profile, factors=identity(profile), step_errors_before=[before],
                       step_errors_after=[after], memory_errors_before=[],
                       memory_errors_after=[], distinct_plans=3,
                       step_errors_held_out=None if held is None else [held])


@pytest.mark.parametrize(("held", "warned"), [
    (0.30, "autoplan tune: warning: the held-out error (30.0%) is above the error before the "
           "fit (20.0%): the fit does not carry to plans it has not seen; keep the profile you "
           "started from, or fit runs of more plans"),
    (-0.10, None),
])
def test_a_held_out_error_above_the_error_before_is_a_warning(capsys, held, warned) -> None:
    warn_overfit(_calibration(0.2, 0.01, held), "tune")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ([warned] if warned else [])
