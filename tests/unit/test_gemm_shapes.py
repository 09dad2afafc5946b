"""benchmarks/gemm_shapes.py: the block GEMMs it times are the cost model's, priced as it prices
them (what the numbers measure on a GPU is the benchmark's to print, not a test's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoplan.cost import compute
from autoplan.hardware import load_profile
from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def gs():
    return load_script("gemm_shapes")


def test_the_shapes_are_the_blocks_gemms_with_their_inner_dimension(gs) -> None:
    mpt = dict((g, (m, n, k)) for g, m, n, k in gs.shapes(gs.model_of("mpt-125m"), 64))
    assert mpt == {"qkv": (64, 2304, 768), "proj": (64, 768, 768), "mlp_up": (64, 3072, 768),
                   "mlp_down": (64, 768, 3072), "logits": (64, 50368, 768)}
    llama = dict((g, (m, n, k)) for g, m, n, k in gs.shapes(gs.model_of("llama-3-8b"), 128))
    # grouped-query K and V (8 of 32 heads), gate and up fused, 14,336-wide down projection
    assert llama["qkv"] == (128, 4096 + 2 * 1024, 4096)
    assert llama["mlp_up"] == (128, 2 * 14336, 4096)
    assert llama["mlp_down"] == (128, 4096, 14336)


def test_the_predicted_share_is_the_cost_models_time_for_that_shape(gs) -> None:
    profile = load_profile("a100-sxm4-80gb")
    m, n, k = 8192, 768, 768
    peak = profile.device.peak("bf16")
    seconds = compute.gemm_time_s(np.array([2.0 * m * n * k]), profile, peak,
                                  (np.array([float(m)]), np.array([float(n)])))[0]
    assert gs.predicted_share(profile, m, n, k, "bf16") == pytest.approx(
        2.0 * m * n * k / seconds / peak)
    # a ragged output quantizes worse than its square twin of the same FLOPs
    assert gs.predicted_share(profile, 8192, 200, 4096, "bf16") < gs.predicted_share(
        profile, 8192, 256, 3200, "bf16")


def test_a_cpu_run_writes_its_rows_once_and_never_overwrites(gs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["--device", "cpu", "--profile", "cpu-gloo", "--precision", "fp32", "--models",
            "mpt-125m", "--tokens", "16", "--repeats", "1", "--json", str(out)]
    assert gs.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["gemm"] for r in rows] == ["qkv", "proj", "mlp_up", "mlp_down", "logits"]
    profile = load_profile("cpu-gloo")
    for r in rows:
        assert r["seconds"] > 0 and r["flops"] == 2.0 * r["m"] * r["n"] * r["k"]
        assert r["predicted_share"] == pytest.approx(
            gs.predicted_share(profile, r["m"], r["n"], r["k"], "fp32"))
    capsys.readouterr()
    assert gs.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0] and "exists" in err[0]
