"""`autoplan calibrate` shows what it fitted (user test 35, findings 5-6): each fitted field
before -> after with its ratio (`values`), every factor as a ratio (`factors`, which mixed
multipliers with op_overhead_s in seconds), a field moved more than 10x flagged, and the
written profile's description says it was calibrated."""

from __future__ import annotations

import json

import pytest
import yaml

from autoplan.calibrate import (
    Calibration,
    apply_factors,
    factor_ratios,
    identity,
)
from autoplan.calibrate_cli import warn_overfit
from autoplan.calibrate_factors import fitted_values, moved_far
from autoplan.commands import main
from autoplan.hardware import load_profile
from tests.unit.test_calibrate import _runs


def test_each_fitted_field_is_shown_before_and_after() -> None:
    base = load_profile("cpu-gloo")
    after = apply_factors(base, dict(identity(base), compute=0.28, op_overhead_s=1e-7))
    values = fitted_values(base, after, ["compute", "op_overhead_s"], "fp32")
    assert values["compute"] == {"field": "device.peak_flops_per_s.fp32",
                                 "before": base.device.peak("fp32"),
                                 "after": after.device.peak("fp32"),
                                 "ratio": pytest.approx(0.28)}
    assert values["op_overhead_s"]["before"] == base.efficiency.op_overhead_s == 2.8e-6
    assert values["op_overhead_s"]["ratio"] == pytest.approx(1e-7 / 2.8e-6)
    assert moved_far(values) == ["op_overhead_s"]  # 28x; compute's 3.6x is not flagged
    ratios = factor_ratios(base, dict(identity(base), compute=0.28, op_overhead_s=1e-7))
    assert ratios["compute"] == 0.28 and ratios["memory_bandwidth"] == 1.0
    assert ratios["op_overhead_s"] == pytest.approx(1e-7 / 2.8e-6) and ratios["overlap"] == 1.0


def test_the_cli_shows_fitted_values_and_describes_the_fit(tmp_path, capsys,
                                                         monkeypatch) -> None:
    base = load_profile("cpu-gloo")
    paths = _runs(tmp_path, apply_factors(base, dict(identity(base), compute=0.5)))
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out", str(out),
                 "--trials", "30", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fitted = load_profile(out)
    compute = data["values"]["compute"]
    assert compute["field"] == "device.peak_flops_per_s.fp32"
    assert compute["before"] == base.device.peak("fp32")
    assert compute["after"] == pytest.approx(fitted.device.peak("fp32"))
    assert compute["ratio"] == data["factors"]["compute"] == pytest.approx(
        fitted.device.peak("fp32") / base.device.peak("fp32"))
    # one unit: every factor a ratio of the field it moves, op_overhead_s too
    assert data["factors"]["op_overhead_s"] == pytest.approx(
        fitted.efficiency.op_overhead_s / base.efficiency.op_overhead_s)
    assert set(data["values"]) - {"reserved_bytes"} == set(data["factors_fitted"])
    text = yaml.safe_load(out.read_text())["description"]
    assert text.startswith(base.description.strip())
    assert "Calibrated by `autoplan calibrate` from cpu-gloo to 8 run(s) of 8 plans: " in text
    assert f"compute x{compute['ratio']:.3g}" in text
    # calibrated again: the earlier fit's sentence is replaced, not added to
    monkeypatch.setenv("COLUMNS", "160")
    again = tmp_path / "again.yaml"
    assert main(["calibrate", *map(str, paths[:2]), "--profile", str(out), "--out", str(again),
                 "--trials", "10", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "fitted values (the profile written)" in table and "after / before" in table
    text = yaml.safe_load(again.read_text())["description"]
    assert text.count("Calibrated by") == 1 and f"from {out} to 2 run(s)" in text


def test_a_field_moved_more_than_ten_times_is_flagged(capsys) -> None:
    profile = load_profile("cpu-gloo")
    values = {"op_overhead_s": {"field": "efficiency.op_overhead_s", "before": 3.9e-6,
                                "after": 1.27e-7, "ratio": 1.27e-7 / 3.9e-6}}
    result = Calibration(profile=profile, factors=identity(profile), step_errors_before=[0.3],
                         step_errors_after=[0.01], memory_errors_before=[],
                         memory_errors_after=[], distinct_plans=3, values=values,
                         step_errors_held_out=[0.1])
    warn_overfit(result)
    assert capsys.readouterr().err.splitlines() == [
        "autoplan calibrate: warning: the fit moved efficiency.op_overhead_s 3.9e-06 -> "
        "1.27e-07 (x0.0326), more than 10x: the runs may not constrain it (the fit may have "
        "moved it to absorb what it does not price); check against the measured value before "
        "trusting plans priced with the fitted profile"]
    warn_overfit(Calibration(profile=profile, factors=identity(profile),
                             step_errors_before=[0.3], step_errors_after=[0.01],
                             memory_errors_before=[], memory_errors_after=[], distinct_plans=3,
                             values={"compute": {**values["op_overhead_s"], "ratio": 0.28}},
                             step_errors_held_out=[0.1]))
    assert capsys.readouterr().err == ""
