"""`autoplan clusters` shows each profile's peak in the precision plans on it train in
(search_space.device_precision, which `precision: auto` and estimate's default plan use):
fp32 on cpu-gloo, whose bf16 peak no default plan runs at; fp16 on a V100; bf16 elsewhere."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict


def _rows(capsys) -> dict[str, dict]:
    assert main(["clusters", "--format", "json"]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_each_profile_names_the_precision_its_plans_train_in(capsys) -> None:
    rows = _rows(capsys)
    assert rows["cpu-gloo"]["precision"] == "fp32"
    assert rows["v100-sxm2-32gb"]["precision"] == "fp16"
    assert rows["h100-sxm-80gb"]["precision"] == "bf16"
    # the same precision estimate's default plan on that profile is priced in
    assert main(["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
                 "--global-batch-size", "2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["precision"] == "fp32"


def test_the_table_shows_cpu_gloos_fp32_peak_not_its_bf16(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["clusters", "--format", "table"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("cpu-gloo"))
    peaks = load_profile("cpu-gloo").device.peak_flops_per_s
    assert f" {peaks['fp32'] / 1e12:g} " in row and f"{peaks['bf16'] / 1e12:g}" not in row, row
    assert "precision plans on it train in" in out


def test_an_fp32_plan_on_cpu_gloo_is_priced_at_the_peak_clusters_shows(capsys) -> None:
    """MFU is stated against the plan precision's own peak: the one the table lists."""
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "parallel": {"dp": 1}, "precision": "fp32",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 2}})
    est = estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 1))
    shown = _rows(capsys)["cpu-gloo"]
    peak = shown["peak_tflops"][shown["precision"]] * 1e12
    flops_per_s = est.model_flops_per_step / est.step_time_s
    assert est.mfu == pytest.approx(flops_per_s / peak, rel=1e-9)


def test_yaml_rounds_for_reading_and_json_keeps_every_digit(capsys) -> None:
    import yaml

    full = _rows(capsys)["a100-sxm4-80gb"]["memory_gib"]
    assert main(["clusters", "--format", "yaml"]) == 0
    rows = {r["name"]: r for r in yaml.safe_load(capsys.readouterr().out)}
    assert full != float(f"{full:.4g}")  # 79.349609375 GiB
    assert rows["a100-sxm4-80gb"]["memory_gib"] == float(f"{full:.4g}")
