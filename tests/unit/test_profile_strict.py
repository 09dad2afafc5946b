"""hardware.py and hardware_efficiency.py load profiles strictly: peak dtypes, attention
kernels, the `measured` section and upper bounds are checked, and every error names the profile
file it came from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from autoplan.commands import main
from autoplan.cost import runtimes
from autoplan.errors import ConfigError
from autoplan.hardware import ATTENTION_KERNELS, load_profile, profile_from_dict
from autoplan.hardware_devices import PEAK_DTYPES
from autoplan.plan import Precision
from autoplan.profile_files import available_profiles
from autoplan.profile_measured import MEASURED_KEYS
from autoplan.profiler import build
from autoplan.profiler.compute import Timing
from autoplan.resources import PROFILES, find


def _raw(name: str = "a100-sxm4-80gb") -> dict[str, Any]:
    path = find(PROFILES, name)
    assert path is not None
    return yaml.safe_load(path.read_text())


def _refused(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        profile_from_dict(raw)
    assert "\n" not in str(err.value)
    return err.value


def test_every_packaged_profile_loads() -> None:
    names = available_profiles()
    assert "cpu-gloo" in names and "h100-sxm-80gb" in names
    for name in names:
        assert load_profile(name).name


def test_the_known_names_match_what_the_cost_model_reads() -> None:
    """fa-triton is priced from fa2's figures, so a profile never files it."""
    assert set(ATTENTION_KERNELS) == set(runtimes.ATTENTION_KERNELS) - {"fa-triton"}
    assert {p.value for p in Precision} <= set(PEAK_DTYPES)


@pytest.mark.parametrize("key", ["BF16", "int8", "fp32 "])
def test_an_unknown_peak_dtype_is_refused(key) -> None:
    """`{BF16: ...}` loaded, and a plan then failed with 'precision=bf16 is not supported'."""
    raw = _raw()
    raw["device"]["peak_flops_per_s"][key] = 1e14
    err = _refused(raw)
    assert err.field.startswith("profile.device.peak_flops_per_s.")
    assert err.problem == "unknown dtype" and "bf16, fp16, fp32, tf32, fp8" in str(err)


@pytest.mark.parametrize("kernel", ["flashattn", "fa-triton", "fa2@bf17", "FA2"])
def test_an_unknown_attention_kernel_is_refused(kernel) -> None:
    """`flashattn: 0.6` loaded and was never read: plans priced with another figure."""
    for table in ("attention_forward", "attention_backward"):
        raw = _raw()
        raw["efficiency"][table][kernel] = 0.6
        err = _refused(raw)
        assert err.field == f"profile.efficiency.{table}.{kernel}"
        assert err.problem == "unknown kernel" and "fa2, fa3, cudnn, sdpa-cpu" in str(err)


def test_known_kernels_and_kernel_at_dtype_load() -> None:
    raw = _raw()
    raw["efficiency"]["attention_forward"] |= {"fa3": 0.7, "sdpa-cpu@fp32": 1.5}
    raw["efficiency"]["attention_backward"] |= {"fa3": 0.6, "sdpa-cpu@fp32": 1.2}
    assert profile_from_dict(raw).efficiency.attention_forward["fa3"] == 0.7


def test_figures_at_a_narrower_head_dim_load_and_others_are_refused() -> None:
    """attention_head_dims files the kernels at head dims below the main tables' 128."""
    raw = _raw()
    raw["efficiency"]["attention_head_dims"] = {64: {"forward": {"fa2": 0.3},
                                                     "backward": {"fa2": 0.25}}}
    assert profile_from_dict(raw).efficiency.attention_head_dims[64].forward["fa2"] == 0.3
    raw["efficiency"]["attention_head_dims"] = {128: {"forward": {"fa2": 0.3},
                                                      "backward": {"fa2": 0.25}}}
    err = _refused(raw)
    assert err.field == "profile.efficiency.attention_head_dims.128"
    assert "attention_forward/backward hold head dim 128" in str(err)
    raw["efficiency"]["attention_head_dims"] = {64: {"forward": {"fa2": 1.3},
                                                     "backward": {"fa2": 0.25}}}
    err = _refused(raw)
    assert err.field == "profile.efficiency.attention_head_dims.64.forward.fa2"
    raw["efficiency"]["attention_head_dims"] = {64: {"forward": {"flashattn": 0.3},
                                                     "backward": {"fa2": 0.25}}}
    assert _refused(raw).problem == "unknown kernel"


def _assembled() -> dict[str, Any]:
    """What build.assemble writes for a CPU measurement (made-up figures)."""
    return build.assemble(_raw("cpu-gloo"), "t", torch.device("cpu"), "fp32",
                          [Timing(1e6, 1e-4), Timing(1e9, 2e-2)], 8e9, 4e9, 1e-6, {}, 5e9,
                          2e8, True)


def test_measured_keys_are_what_build_writes() -> None:
    prof = _assembled()
    assert set(prof["measured"]) == set(MEASURED_KEYS)
    assert profile_from_dict(prof).measured is not None


@pytest.mark.parametrize(("measured", "field", "needle"), [
    ({}, "profile.measured", "is empty"),
    ({"foo": 1}, "profile.measured.foo", "unknown key"),
    ({"matmul": [[1e6, 1e-4]]}, "profile.measured", "lacks date, torch"),
])
def test_a_stray_measured_section_is_refused(measured, field, needle) -> None:
    """Any `measured` turned off the datasheet GEMM quantization (compute.gemm_time_s)."""
    raw = _raw()
    raw["measured"] = measured
    err = _refused(raw)
    assert err.field == field and needle in str(err)


def test_a_measured_profile_with_an_unknown_key_is_refused() -> None:
    prof = _assembled()
    prof["measured"]["matmull"] = []
    assert _refused(prof).field == "profile.measured.matmull"


def test_a_calibrated_datasheet_profile_loads() -> None:
    """`autoplan calibrate` on a datasheet profile writes `measured: {calibration: ...}`."""
    raw = _raw()
    raw["measured"] = {"calibration": {"runs": 3}}
    assert profile_from_dict(raw).measured == {"calibration": {"runs": 3}}


@pytest.mark.parametrize(("section", "key", "value", "field"), [
    ("device", "peak_flops_per_s", {"bf16": 1e40}, "profile.device.peak_flops_per_s.bf16"),
    ("efficiency", "op_overhead_s", 10.0, "profile.efficiency.op_overhead_s"),
    ("efficiency", "fsdp_unit_overhead_s", 1.0, "profile.efficiency.fsdp_unit_overhead_s"),
    (None, "gpus_per_node", 10**9, "profile.gpus_per_node"),
])
def test_values_past_any_real_hardware_are_refused(section, key, value, field) -> None:
    raw = _raw()
    (raw[section] if section else raw)[key] = value
    assert _refused(raw).field == field


def test_load_errors_name_the_user_file_that_shadows_a_builtin(tmp_path, monkeypatch) -> None:
    raw = _raw()
    raw["gpus_per_nod"] = raw.pop("gpus_per_node")
    user = tmp_path / "a100-sxm4-80gb.yaml"
    user.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_profile("a100-sxm4-80gb")
    assert err.value.field == f"profile a100-sxm4-80gb ({user}).gpus_per_nod"
    assert err.value.problem == "unknown key"


def _write(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def test_search_over_several_profiles_names_the_one_that_failed(tmp_path, capsys) -> None:
    good = _write(tmp_path / "a.yaml", _raw())
    bad_raw = _raw()
    bad_raw["gpus_per_node"] = 0
    bad = _write(tmp_path / "b.yaml", bad_raw)
    code = main(["search", "--model", "gpt3-1.3b", "--cluster", f"{good},{bad}",
                 "--num-gpus", "8", "--global-batch-size", "64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"profile '{bad}'.gpus_per_node: got 0" in err


def test_a_curve_error_names_the_curve_once() -> None:
    """It read `profile.efficiency.matmul.curve.y`: the table's own name was added twice."""
    raw = _raw()
    bad = copy.deepcopy(raw)
    bad["efficiency"]["matmul"]["y"][-1] = 1.5
    assert _refused(bad).field == "profile.efficiency.matmul.y"
    bad = copy.deepcopy(raw)
    bad["efficiency"]["intra_node"]["x"] = [1000.0, 100.0]
    bad["efficiency"]["intra_node"]["y"] = [0.5, 0.6]
    assert _refused(bad).field == "profile.efficiency.intra_node.x"


def test_a_gpu_measurement_reads_attention_at_its_gemms_clock(monkeypatch) -> None:
    """A GPU profile keeps the papers' burst-clock attention figures beside GEMMs it timed on
    one GPU, also at burst clock: one clock for both (attention_clock 1), where the datasheet
    base reads the figures at its loaded-node GEMM top's clock (0.915). A CPU one too."""
    import types

    base = _raw("h100-sxm-80gb")
    assert base["efficiency"]["attention_clock"] < 1.0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _d: types.SimpleNamespace(total_memory=85_000_000_000))
    prof = build.assemble(base, "t", torch.device("cuda", 0), "bf16",
                          [Timing(1e9, 2e-6), Timing(1e12, 1.3e-3)], 3e12, 2.5e12, 0.0, {},
                          48e9, 6e9, True)
    assert prof["efficiency"]["attention_clock"] == 1.0
    assert prof["efficiency"]["attention_forward"] == base["efficiency"]["attention_forward"]
    assert profile_from_dict(prof).efficiency.attention_clock == 1.0
    assert _assembled()["efficiency"]["attention_clock"] == 1.0
