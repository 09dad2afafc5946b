"""`autoplan profile`: the derivations are right, and a measured profile is a usable profile."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile, profile_from_dict
from autoplan.plan import plan_from_dict
from autoplan.profiler.build import MIN_EFF, matmul_curve
from autoplan.profiler.compute import Timing
from autoplan.yaml_io import save_yaml, to_dict


def test_matmul_curve_is_achieved_over_peak() -> None:
    curve = matmul_curve([Timing(1e9, 0.01), Timing(1e11, 0.5)], peak=2e11)
    assert curve["y"] == pytest.approx([0.5, 1.0])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "cpu-test.yaml"
    code = main(["profile", "--quick", "--ranks", "2", "--out", str(out), "--format", "json"])
    assert code == 0
    return out


def test_measured_profile_loads_and_scores_plans(measured, capsys) -> None:
    prof = load_profile(measured)
    raw = yaml.safe_load(measured.read_text())
    assert raw["measured"]["collectives"]["2"]["all_reduce"]
    assert prof.device.peak("fp32") == pytest.approx(max(s / t for s, t in raw["measured"]["matmul"]))
    assert 0 < prof.intra_node.bytes_per_s and 0 < prof.intra_node.latency_s < 1
    capsys.readouterr()
    code = main(["estimate", "--model", "tiny", "--cluster", str(measured), "--num-gpus", "2",
                 "--global-batch-size", "8", "--set", "precision=fp32", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["time"]["dp_comm"] > 0


def test_measured_profile_prices_bf16_from_its_own_bf16_timings(measured) -> None:
    """profiler.precision: the bf16 peak is fp32's scaled by the runtime GEMMs' time ratio, and
    each dtype's attention entry reproduces its measured forward seconds."""
    prof = load_profile(measured)
    raw = yaml.safe_load(measured.read_text())["measured"]["precision"]
    gemm = raw["gemm_seconds"]
    assert prof.device.peak("bf16") == pytest.approx(
        prof.device.peak("fp32") * gemm["fp32"] / gemm["bf16"])
    for prec in ("fp32", "bf16"):
        eff = prof.efficiency.attention_forward[f"sdpa-cpu@{prec}"]
        seconds = 0.5 * raw["attention_core_flops"] / (prof.device.peak(prec) * eff)
        assert seconds == pytest.approx(raw["attention_seconds"][prec][0], rel=1e-6)


@pytest.mark.parametrize("layout", [
    {"parallel": {"dp": 2}},
    {"parallel": {"tp": 2}, "recompute": {"policy": "selective"}},
])
def test_measured_profile_round_trips_to_the_same_estimates(measured, tmp_path, layout) -> None:
    prof = load_profile(measured)
    assert prof.measured is not None
    layers = prof.measured["layers"]
    assert layers["columns"] == ["layer", "model", "mbs", "seq", "tp", "hidden", "fwd_s", "bwd_s",
                                 "flops", "ops"]
    assert {r[0] for r in layers["rows"]} == {"attention", "mlp", "norm", "embedding", "logits",
                                              "block"}
    assert prof.measured["saved_activations"]["rows"]
    copy = tmp_path / "copy.yaml"
    save_yaml(to_dict(prof) | {"schema_version": 1}, copy)
    again = load_profile(copy)
    assert again == prof
    assert again.measured["layers"] == layers
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "x", "num_gpus": 2},
                           "precision": "fp32",
                           "batch": {"micro_batch_size": 2, "global_batch_size": 8}} | layout)
    a = estimate_plan(plan, ClusterSpec(prof, 2))
    b = estimate_plan(plan, ClusterSpec(again, 2))
    assert a.time == b.time and a.memory == b.memory
    assert np.isfinite(a.time["step"])


def test_layer_points_are_on_the_curve_when_used(measured) -> None:
    prof = load_profile(measured)
    fed = prof.measured["matmul_from_layers"]
    assert fed["points"]  # the quick grid's GELU MLP rows are GEMM-bound on this machine
    err = fed["block_log_error"]
    assert fed["used"] == (err["with_points"] <= err["square_gemms"])
    curve = prof.efficiency.matmul
    if fed["used"]:
        for x, y in fed["points"]:
            assert float(curve(x)) == pytest.approx(min(1.0, max(MIN_EFF, y)))
    else:
        assert list(curve.x) == [size for size, _ in prof.measured["matmul"]]


def test_layer_points_verdict_is_priced_with_the_final_profile(measured) -> None:
    """The square-GEMM and fed errors recorded are those of the written profile's own fields
    (dispatch, attention, collectives). They were taken inside build.assemble, before
    cli._profile applied the dispatch and precision measurements: with the base profile's
    DTensor and attention figures (recorded 0.395 against 0.458 from the profile written)."""
    from autoplan.profiler.build import with_layer_points
    from autoplan.profiler.compare import layer_error

    raw = yaml.safe_load(measured.read_text())
    m = raw["measured"]
    fed = m["matmul_from_layers"]
    square = matmul_curve([Timing(s, t) for s, t in m["matmul"]],
                          float(raw["device"]["peak_flops_per_s"]["fp32"]))

    def error(curve: dict) -> float | None:
        prof = profile_from_dict(raw | {"efficiency": raw["efficiency"] | {"matmul": curve}})
        return layer_error(m["layers"], m["layer_models"], prof, "fp32")

    assert fed["block_log_error"] == {
        "square_gemms": pytest.approx(error(square), rel=1e-9),
        "with_points": pytest.approx(error(with_layer_points(square, fed["points"])), rel=1e-9)}


def test_profile_refuses_to_overwrite(measured, capsys) -> None:
    before = measured.read_text()
    assert main(["profile", "--quick", "--out", str(measured)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert measured.read_text() == before


def test_measured_profile_validates_strictly(measured) -> None:
    raw = yaml.safe_load(measured.read_text())
    raw["efficiency"]["matmul"]["y"][0] = 0.0
    with pytest.raises(ConfigError, match="matmul.y"):
        profile_from_dict(raw)


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("efficiency", "overlap"), 5, "efficiency.overlap"),
    (("host", "pcie_bytes_per_s"), -1, "host.pcie_bytes_per_s"),
    (("device", "hbm_bytes_per_s"), 0, "device.hbm_bytes_per_s"),
    (("device", "memory_bytes"), -1, "device.memory_bytes"),
])
def test_profile_values_are_range_checked(path, value, needle) -> None:
    from autoplan.hardware import PROFILES_DIR
    raw = yaml.safe_load((PROFILES_DIR / "a100-sxm4-80gb.yaml").read_text())
    raw[path[0]][path[1]] = value
    with pytest.raises(ConfigError) as err:
        profile_from_dict(raw)
    assert err.value.field == f"profile.{needle}"


def test_measured_attention_may_beat_the_peak_a_cpu_profile_infers() -> None:
    """On a CPU without native bf16 GEMMs the bf16 peak (fp32's scaled by the GEMM time ratio)
    is low, and bf16 attention can run faster than it: the measured share is kept above 1 so
    the seconds it reproduces are the measured ones; a datasheet kernel's share stays a
    fraction."""
    from autoplan.hardware import Curve, Efficiency
    from autoplan.profiler.precision import attention_efficiency

    fwd, bwd = attention_efficiency((1e-3, 4e-3), core_flops=8e9, peak=2e12, causal_skip=True)
    assert fwd == pytest.approx(0.5 * 8e9 / (2e12 * 1e-3)) and fwd > 1
    curve = Curve((1e6, 1e9), (0.1, 0.5))
    Efficiency(matmul=curve, attention_forward={"sdpa-cpu@bf16": fwd})
    with pytest.raises(ConfigError, match="attention_forward.fa2"):
        Efficiency(matmul=curve, attention_forward={"fa2": fwd})


def test_an_attention_figure_by_length_loads_as_a_checked_curve() -> None:
    """A profile may file a kernel by sequence length ({x: tokens, y: shares}); a share above
    the peak or lengths out of order are refused naming the entry."""
    import yaml

    from autoplan.hardware import Curve, profile_from_dict, scale_figure
    from autoplan.resources import PROFILES, package_dir

    data = yaml.safe_load((package_dir(PROFILES) / "h100-sxm-80gb.yaml").read_text())
    fa2 = profile_from_dict(data).efficiency.attention_forward["fa2"]
    assert isinstance(fa2, Curve) and fa2.x[0] == 512 and fa2(512) < fa2(16384)
    assert scale_figure(fa2, 0.5)(4096) == pytest.approx(0.5 * fa2(4096))
    for bad in ({"x": [512, 1024], "y": [0.2, 1.5]}, {"x": [1024, 512], "y": [0.2, 0.3]}):
        data["efficiency"]["attention_forward"]["fa2"] = bad
        with pytest.raises(ConfigError, match="attention_forward.fa2"):
            profile_from_dict(data)


@pytest.mark.parametrize("target", ["{dir}", "/proc/autoplan-no-such/p.yaml"])
def test_profile_refuses_an_out_it_cannot_write_before_measuring(tmp_path, capsys,
                                                                 target) -> None:
    """A directory (or a folder nothing can be made in) was found only at the save, after
    every measurement (IsADirectoryError); now it is refused before the first."""
    import time

    if target.startswith("/proc") and not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    out = target.format(dir=tmp_path)
    start = time.monotonic()
    assert main(["profile", "--quick", "--device", "cpu", "--force", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - start < 15, "refused only after measuring"
    assert len(err.splitlines()) == 1 and "--out" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_quick_gemm_sizes_increase_and_end_at_the_largest(kind: str) -> None:
    """--quick keeps every other size and the largest once: a size measured twice made the
    matmul curve's x repeat, which the profile loader refuses after all the measuring."""
    import torch

    from autoplan.profiler.compute import matmul_sizes

    device = torch.device(kind)
    quick, full = matmul_sizes(device, True), matmul_sizes(device, False)
    assert all(b > a for a, b in zip(quick, quick[1:], strict=False))
    assert quick[-1] == full[-1] and set(quick) <= set(full)


def test_a_gpu_without_bf16_measures_fp16_and_a_missing_peak_is_refused() -> None:
    """A V100's datasheet profile has no bf16 peak: the GEMMs are measured in fp16 by default,
    and asking for bf16 is refused before any measuring (it was a KeyError after it)."""
    from autoplan.errors import ConfigError
    from autoplan.profiler.cli import gemm_precision
    from autoplan.resources import PROFILES, find
    from autoplan.yaml_io import read_yaml

    v100 = read_yaml(find(PROFILES, "v100-sxm2-32gb"), "--base")
    assert gemm_precision(None, True, v100, "v100-sxm2-32gb") == "fp16"
    with pytest.raises(ConfigError, match="--precision"):
        gemm_precision("bf16", True, v100, "v100-sxm2-32gb")
    h100 = read_yaml(find(PROFILES, "h100-sxm-80gb"), "--base")
    assert gemm_precision(None, True, h100, "h100-sxm-80gb") == "bf16"
    assert gemm_precision(None, False, v100, "cpu-gloo") == "fp32"


def test_a_profile_reserving_all_its_memory_is_refused() -> None:
    """reserved_bytes (CUDA context, workspaces) at or past the device memory left no room
    and loaded anyway."""
    from autoplan.errors import ConfigError
    from autoplan.hardware import profile_from_dict
    from autoplan.resources import PROFILES, find
    from autoplan.yaml_io import read_yaml

    data = read_yaml(find(PROFILES, "h100-sxm-80gb"), "--base")
    data["device"]["reserved_bytes"] = data["device"]["memory_bytes"]
    with pytest.raises(ConfigError, match="reserved_bytes"):
        profile_from_dict(data)
