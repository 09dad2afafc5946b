"""calibrate_devices: which device a profile or a run record's machine.device names, as train,
tune, export, profile and calibrate compare them, and the file a profile reference names."""

from __future__ import annotations

import pytest

from autoplan.calibrate_devices import device_model, device_token, profile_file
from autoplan.hardware import load_profile


@pytest.mark.parametrize(("name", "token"), [
    ("NVIDIA A100-SXM4-80GB", "a100"), ("A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("H100-SXM5-80GB", "h100"),
    ("AMD Instinct MI300X", "mi300x"), ("cpu", "cpu"), ("CPU", "cpu"),
])
def test_a_device_name_reads_as_its_model_token(name: str, token: str) -> None:
    assert device_token(name) == token


@pytest.mark.parametrize(("ref", "model"), [
    ("cpu-gloo", "cpu"), ("h100-sxm-80gb", "h100"), ("a100-sxm4-80gb", "a100"),
    ("v100-sxm2-32gb", "v100"),
])
def test_a_profile_describes_its_device(ref: str, model: str) -> None:
    assert device_model(load_profile(ref)) == model


def test_a_profile_reference_names_its_file_or_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path / "none-here"))
    found = profile_file("cpu-gloo")
    assert found is not None and found.name == "cpu-gloo.yaml" and found.is_absolute()
    assert profile_file("no-such-profile") is None
    mine = tmp_path / "mine.yaml"
    mine.write_text("{}")
    assert profile_file(str(mine)) == mine.resolve()
    assert profile_file(str(tmp_path / "missing.yaml")) is None
    assert profile_file(str(tmp_path / ("x" * 300 + ".yaml"))) is None  # past NAME_MAX
