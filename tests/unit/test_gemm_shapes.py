"""benchmarks/gemm_shapes.py: the block GEMMs and attention it times are the cost model's, priced
as it prices them (what the numbers measure on a GPU is the benchmark's to print, not a test's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_the_backward_passes_are_the_two_gradient_gemms_of_the_same_flops(gs) -> None:
    m, n, k = 8192, 2304, 768
    assert gs.pass_shape("fwd", m, n, k) == (m, n, k)
    assert gs.pass_shape("dgrad", m, n, k) == (m, k, n)  # dX = dY W^T: m x k over n
    assert gs.pass_shape("wgrad", m, n, k) == (k, n, m)  # dW = X^T dY: k x n over the tokens
    for p in gs.PASSES:
        a, b, c = gs.pass_shape(p, m, n, k)
        assert a * b * c == m * n * k


def test_attention_is_priced_causal_at_the_kernels_figures(gs) -> None:
    profile = load_profile("a100-sxm4-80gb")
    # half of 4 b s^2 (a d): the cost model's core FLOPs with its causal skip
    assert gs.attention_work(2, 1024, 12, 64) == pytest.approx(
        0.5 * 4.0 * 2 * 1024**2 * 12 * 64)
    fwd, bwd = gs.predicted_attention_shares(profile, "fa2", 1e12, 2048)
    clock = profile.efficiency.attention_clock  # the figures at the loaded node's clock
    assert (fwd, bwd) == pytest.approx((clock * profile.efficiency.attention_forward["fa2"](2048.0),
                                        clock * profile.efficiency.attention_backward["fa2"](2048.0)))
    # a profile that files the kernel by length is read at the sweep's length
    h100 = load_profile("h100-sxm-80gb")
    assert gs.predicted_attention_shares(h100, "fa2", 1e12, 512)[0] == pytest.approx(
        h100.efficiency.attention_clock * 191 / 989, abs=1e-3)
    assert gs.attention_kernel(torch.device("cpu"), "bf16") == "sdpa-cpu@bf16"


def test_a_cpu_run_writes_its_rows_once_and_never_overwrites(gs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["--device", "cpu", "--profile", "cpu-gloo", "--precision", "fp32", "--models",
            "mpt-125m", "--tokens", "16", "--repeats", "1", "--attention-models", "mpt-125m",
            "--attention-tokens", "64", "--seq-lens", "16", "32", "--json", str(out)]
    assert gs.main(argv) == 0
    written = json.loads(out.read_text())
    rows = written["rows"]
    assert [(r["gemm"], r["pass"]) for r in rows] == [
        (g, p) for g in ("qkv", "proj", "mlp_up", "mlp_down", "logits") for p in gs.PASSES]
    profile = load_profile("cpu-gloo")
    for r in rows:
        assert r["seconds"] > 0 and r["flops"] == 2.0 * r["m"] * r["n"] * r["k"]
        fwd = next(x for x in rows if x["gemm"] == r["gemm"] and x["pass"] == "fwd")
        assert (r["m"], r["n"], r["k"]) == gs.pass_shape(r["pass"], fwd["m"], fwd["n"], fwd["k"])
        # both backward GEMMs priced at the forward's rate, as compute.layer_times_s does
        assert r["predicted_share"] == pytest.approx(
            gs.predicted_share(profile, fwd["m"], fwd["n"], fwd["k"], "fp32"))
    attention = written["attention"]
    assert [(r["seq"], r["batch"], r["pass"]) for r in attention] == [
        (16, 4, "fwd"), (16, 4, "bwd"), (32, 2, "fwd"), (32, 2, "bwd")]
    for r in attention:
        work = gs.attention_work(r["batch"], r["seq"], 12, 64)
        assert r["flops"] == pytest.approx(work * (1.0 if r["pass"] == "fwd" else 2.5))
        assert r["predicted_share"] == pytest.approx(gs.predicted_attention_shares(
            profile, "sdpa-cpu@fp32", work, r["seq"])[0 if r["pass"] == "fwd" else 1])
    capsys.readouterr()
    assert gs.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0] and "exists" in err[0]
