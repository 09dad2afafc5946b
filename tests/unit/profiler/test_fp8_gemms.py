"""`autoplan profile` times FP8 GEMMs where the GPU has FP8 tensor cores and writes
efficiency.fp8_matmul from them: the GEMM it times is the product it claims, the figure is
the FP8 share over the curve's share at the same size, a figure no profile loads keeps the
base's, and a device without FP8 says why it was not timed."""

from __future__ import annotations

import copy

import pytest
import torch

from autoplan.hardware import profile_from_dict
from autoplan.profiler import build, compute
from autoplan.profiler.compute import Timing
from autoplan.resources import PROFILES, find
from autoplan.yaml_io import read_yaml


def test_the_timed_fp8_gemm_is_the_product_of_its_operands() -> None:
    # the second operand is column-major: a transposed layout would multiply by b.T
    a, b = compute.fp8_operands(64, torch.device("cpu"))
    got = compute.fp8_gemm(a, b, torch.ones(()))
    want = a.float() @ b.float()
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=5e-2)
    assert not torch.allclose(got.float(), a.float() @ b.float().t(), rtol=2e-2, atol=5e-2)


def test_fp8_is_timed_at_the_training_sizes_of_the_curve() -> None:
    gpu = torch.device("cuda", 0)  # a device object only: nothing runs on it
    assert compute.fp8_sizes(gpu, quick=False) == [4096, 8192]
    assert compute.fp8_sizes(gpu, quick=True) == [8192]
    assert set(compute.fp8_sizes(gpu, quick=False)) <= set(compute.matmul_sizes(gpu, False))


def test_the_figure_is_the_fp8_share_over_the_curve_share() -> None:
    # 16-bit: 1e12 FLOPs in 2 ms of a 1e15 peak, 0.5 of it; FP8: in 1.25 ms of a 2e15 peak,
    # 0.4 of it: 0.8 of the curve's share. The median of the sizes.
    curve = [Timing(1e11, 2e-4), Timing(1e12, 2e-3)]
    fp8 = [Timing(1e11, 1.0e-4), Timing(1e12, 1.25e-3)]
    assert build.fp8_matmul_ratio(fp8[1:], curve, 2e15, 1e15) == pytest.approx(0.8)
    assert build.fp8_matmul_ratio(fp8, curve, 2e15, 1e15) == pytest.approx((1.0 + 0.8) / 2)


def test_fp8_at_a_size_the_curve_lacks_is_refused() -> None:
    with pytest.raises(Exception, match="none of which the matmul curve measured"):
        build.fp8_matmul_ratio([Timing(3e11, 1e-3)], [Timing(1e11, 1e-3)], 2e15, 1e15)


def _assembled(fp8: list[Timing] | None) -> dict:
    """A CPU profile assembled from cpu-gloo with a stated fp8 peak of twice the measured
    curve's best (its 16-bit peak on a CPU), so each FP8 time sets a known figure."""
    base = copy.deepcopy(read_yaml(find(PROFILES, "cpu-gloo"), "base"))
    matmul = [Timing(1e9, 1e-1), Timing(2e9, 1e-1)]  # best 2e10 FLOP/s: the CPU's peak
    base["device"]["peak_flops_per_s"]["fp8"] = 4e10
    return build.assemble(base, "t", torch.device("cpu"), "fp32", matmul, 1e10, 1e10, 1e-6,
                          {}, 1e9, 1e8, True, None, fp8)


def test_a_measured_figure_goes_into_the_profile_it_loads_from() -> None:
    # FP8 at 2e9 FLOPs in 0.0625 s: 3.2e10 of a 4e10 peak, 0.8; the curve there is at 1.0
    prof = _assembled([Timing(2e9, 0.0625)])
    assert prof["efficiency"]["fp8_matmul"] == pytest.approx(0.8)
    assert prof["measured"]["fp8_matmul"]["applied"] is True
    assert profile_from_dict(prof).efficiency.fp8_matmul == pytest.approx(0.8)


def test_a_figure_no_profile_loads_keeps_the_base_and_says_so() -> None:
    # FP8 at 4x the curve's share: a sparse or wrong fp8 peak in the base, not a measurement
    prof = _assembled([Timing(2e9, 0.0125)])
    record = prof["measured"]["fp8_matmul"]
    assert record["ratio"] == pytest.approx(4.0) and record["applied"] is False
    assert "fp8_matmul" not in prof["efficiency"]  # cpu-gloo states none: the default holds
    assert profile_from_dict(prof).efficiency.fp8_matmul == 1.0


def test_without_fp8_timings_the_profile_has_no_record() -> None:
    prof = _assembled(None)
    assert "fp8_matmul" not in prof["measured"]
    profile_from_dict(prof)  # and loads


@pytest.mark.parametrize(("capability", "peaks", "why"), [
    ((8, 0), {"bf16": 3.12e14, "fp8": 6.24e14}, "compute capability 8.0 has no FP8"),
    ((9, 0), {"bf16": 9.89e14}, "no fp8 peak"),
    ((9, 0), {"bf16": 9.89e14, "fp8": 1.979e15}, None),
    ((8, 9), {"bf16": 1.81e14, "fp8": 3.62e14}, None),
])
def test_which_gpus_time_fp8(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int],
                             peaks: dict[str, float], why: str | None) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    got = compute.fp8_unavailable(torch.device("cuda", 0),
                                  {"device": {"peak_flops_per_s": peaks}})
    assert (got is None) if why is None else (why in (got or ""))


def test_a_cpu_times_no_fp8() -> None:
    assert "CPU" in (compute.fp8_unavailable(torch.device("cpu"), {}) or "")
