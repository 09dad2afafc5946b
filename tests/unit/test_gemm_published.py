"""benchmarks/gemm_published.py: published GEMM measurements against the cost model's prices
(what the numbers say is the benchmark's to print; here: the data holds, and the comparison
prices each GEMM as a block's GEMMs are priced)."""

from __future__ import annotations

import pytest

from autoplan.hardware import load_profile
from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def gp():
    return load_script("gemm_published")


def test_every_published_rate_is_a_share_of_its_gpus_peak(gp) -> None:
    sets = gp.load_sets(gp.DEFAULT_DATA)
    assert {s["id"] for s in sets} >= {"xla-sm90-bf16", "azure-nd-a100-v4-cublaslt-fp16"}
    xla = next(s for s in sets if s["id"] == "xla-sm90-bf16")
    assert len(xla["rows"]) == 375  # b in 1, 2, 4 x m, n, k in 256 ... 4096 (5 each)
    for s in sets:
        for r in gp.compare(s):
            assert 0 < r["measured"] < 1 and 0 < r["priced"] <= r["curve_alone"] <= 1


def test_a_rate_above_the_peak_is_refused(gp, tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nsets:\n  - id: x\n    device: A100\n"
                   "    profile: a100-sxm4-80gb\n    precision: bf16\n"
                   "    rows: [[1, 1024, 1024, 1024, 400.0]]\n")
    assert gp.main(["--data", str(bad)]) == 2


def test_a_batch_is_priced_as_its_gemms_folded_into_rows(gp) -> None:
    """b GEMMs of m x n over k cost what one (b m) x n GEMM over k does (the same output
    tiles), the way a block folds its tokens into m; the shares are of the set's peak."""
    s = {"id": "t", "device": "H100", "profile": "h100-sxm-80gb", "precision": "bf16",
         "rows": [[4, 256, 1024, 2048, 300.0], [1, 1024, 1024, 2048, 300.0]]}
    batched, folded = gp.compare(s)
    assert batched["flops"] == folded["flops"] == 2.0 * 1024 * 1024 * 2048
    assert batched["priced"] == pytest.approx(folded["priced"])
    assert batched["measured"] == pytest.approx(
        300e12 / load_profile("h100-sxm-80gb").device.peak("bf16"))


def test_the_ratio_is_the_priced_over_the_measured_time(gp) -> None:
    """A GEMM priced at half the share it measured takes twice the time priced: ratio 2."""
    records = [{"flops": 5e10, "measured": 0.6, "priced": 0.3, "curve_alone": 0.6},
               {"flops": 5e10, "measured": 0.4, "priced": 0.4, "curve_alone": 0.5}]
    out = gp.summarize(records)
    assert [b["gemms"] for b in out["bins"]] == [2]
    assert out["all"]["time_ratio"] == pytest.approx(1.5)  # median of 2.0 and 1.0
    assert out["all"]["time_mape"] == pytest.approx(0.5)
    assert out["all"]["curve_alone_ratio"] == pytest.approx((1.0 + 0.8) / 2)
