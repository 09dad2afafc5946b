"""benchmarks/gemm_published.py: published GEMM measurements against the cost model's prices
(what the numbers say is the benchmark's to print; here: the data holds, and the comparison
prices each GEMM as a block's GEMMs are priced)."""

from __future__ import annotations

import pytest

from autoplan.errors import ConfigError
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


@pytest.mark.parametrize(("set_id", "profile", "derived"), [
    ("azure-nd-h100-v5-cublaslt-fp8", "h100-sxm-80gb", 0.960),
    ("azure-nd-h200-v5-cublaslt-fp8", "h200-sxm-141gb", 0.941)])
def test_each_profile_files_the_fp8_figure_its_cublaslt_table_measures(gp, set_id, profile,
                                                                       derived) -> None:
    """Efficiency.fp8_matmul is read off the published FP8 table, not typed: the median of the
    measured over the curve's share over the training-shaped GEMMs (the 1024^3-2048^3 and the
    192-wide GEMMs left out), whatever the profile files now (its own figure is divided back
    out, so filing it moves no derivation)."""
    s = next(s for s in gp.load_sets(gp.DEFAULT_DATA) if s["id"] == set_id)
    assert gp.fp8_matmul(s) == pytest.approx(derived, abs=5e-4)
    assert load_profile(profile).efficiency.fp8_matmul == round(gp.fp8_matmul(s), 2)
    picked = [r for r in gp.compare(s) if r["flops"] >= gp.TRAINING_GEMM_FLOPS
              and min(r["m"], r["n"], r["k"]) >= gp.TRAINING_GEMM_DIM]
    assert len(picked) == 5 and all(r["n"] >= 4096 for r in picked)


def test_the_fp8_figure_prices_fp8_gemms_and_no_others(gp) -> None:
    """An FP8 set is priced at the profile's FP8 figure, a 16-bit one at the curve: the same
    shape's priced share in fp8 is fp8_matmul times its bf16 share (one peak-relative curve)."""
    h100 = load_profile("h100-sxm-80gb")
    rows = [[1, 8192, 8192, 8192, 600.0]]
    fp8 = gp.compare({"id": "a", "profile": "h100-sxm-80gb", "precision": "fp8", "rows": rows})
    bf16 = gp.compare({"id": "b", "profile": "h100-sxm-80gb", "precision": "bf16", "rows": rows})
    assert h100.efficiency.fp8_matmul < 1.0
    assert fp8[0]["priced"] == pytest.approx(h100.efficiency.fp8_matmul * bf16[0]["priced"])
    assert fp8[0]["curve_alone"] == pytest.approx(
        h100.efficiency.fp8_matmul * bf16[0]["curve_alone"])


def test_the_same_die_s_profiles_borrow_the_h100_figure() -> None:
    """H800 (the GH100 die at the same 700 W) and the 500 W H100s torchtitan ran on file no
    table of their own: they carry the H100 SXM figure, as their comments say."""
    h100 = load_profile("h100-sxm-80gb").efficiency.fp8_matmul
    assert [load_profile(p).efficiency.fp8_matmul
            for p in ("h800-sxm-80gb", "h100-96gb-500w")] == [h100, h100]
    assert load_profile("a100-sxm4-80gb").efficiency.fp8_matmul == 1.0  # no fp8 there


def test_an_fp8_set_with_no_training_shaped_gemm_is_refused(gp) -> None:
    """The figure is read at training shapes only: a set of small or skinny GEMMs gives none,
    and says which field and why rather than a median of nothing."""
    s = {"id": "small", "profile": "h100-sxm-80gb", "precision": "fp8",
         "rows": [[1, 2048, 2048, 2048, 900.0], [1, 802816, 192, 768, 600.0]]}
    with pytest.raises(ConfigError, match=r"small\.rows: no GEMM of a training block's shape"):
        gp.fp8_matmul(s)
