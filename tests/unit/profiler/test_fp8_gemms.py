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


def test_the_operands_are_laid_out_as_cublaslt_takes_them() -> None:
    # cuBLASLt's FP8 GEMM takes a row-major first and a column-major second operand (a CPU's
    # _scaled_mm takes any layout, so the strides are what a test here can hold it to)
    a, b = compute.fp8_operands(64, torch.device("cpu"))
    assert a.dtype == b.dtype == torch.float8_e4m3fn
    assert a.stride() == (64, 1) and b.stride() == (1, 64)


def test_the_timed_fp8_gemm_is_the_product_of_its_operands() -> None:
    a, b = compute.fp8_operands(64, torch.device("cpu"))
    got = compute.fp8_gemm(a, b, torch.ones(()))
    want = a.float() @ b.float()
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=5e-2)
    assert not torch.allclose(got.float(), a.float() @ b.float().t(), rtol=2e-2, atol=5e-2)


FP8_GPU = torch.cuda.is_available() and compute.fp8_unavailable(
    torch.device("cuda", 0), {"device": {"peak_flops_per_s": {"fp8": 1.0}}}) is None


@pytest.mark.skipif(not FP8_GPU, reason="needs a CUDA GPU with FP8 tensor cores")
def test_on_an_fp8_gpu_the_timed_gemm_runs_and_is_the_product() -> None:
    gpu = torch.device("cuda", 0)
    a, b = compute.fp8_operands(256, gpu)
    got = compute.fp8_gemm(a, b, torch.ones((), device=gpu))
    assert torch.allclose(got.float().cpu(), (a.float() @ b.float()).cpu(), rtol=2e-2,
                          atol=1e-1)
    fast = compute.fp8_gemm(a, b, torch.ones((), device=gpu), fast_accum=True)
    assert torch.allclose(fast.float(), got.float(), rtol=2e-2, atol=1e-1)
    (timing,) = compute.measure_fp8_matmul(gpu, [256], quick=True, fast_accum=True)
    assert timing.size == 2.0 * 256**3 and timing.seconds > 0


def test_fp8_is_timed_at_the_training_sizes_of_the_curve() -> None:
    gpu = torch.device("cuda", 0)  # a device object only: nothing runs on it
    assert compute.fp8_sizes(gpu, quick=False) == [4096, 8192]
    assert compute.fp8_sizes(gpu, quick=True) == [8192]
    assert set(compute.fp8_sizes(gpu, quick=False)) <= set(compute.matmul_sizes(gpu, False))


def test_a_pass_figure_is_the_fp8_share_over_the_curve_share() -> None:
    # 16-bit: 1e12 FLOPs in 2 ms of a 1e15 peak, 0.5 of it; FP8: in 1.25 ms of a 2e15 peak,
    # 0.4 of it: 0.8 of the curve's share. The median of the sizes.
    curve = [Timing(1e11, 2e-4), Timing(1e12, 2e-3)]
    fp8 = [Timing(1e11, 1.0e-4), Timing(1e12, 1.25e-3)]
    ratio, by_pass = build.fp8_matmul_ratio({"backward": fp8[1:]}, curve, 2e15, 1e15)
    assert ratio == by_pass["backward"] == pytest.approx(0.8)
    _, by_pass = build.fp8_matmul_ratio({"backward": fp8}, curve, 2e15, 1e15)
    assert by_pass["backward"] == pytest.approx((1.0 + 0.8) / 2)


def test_the_profile_figure_is_a_layer_rate_a_third_forward() -> None:
    # forward (fast accumulation) at 1.0 of the curve's share, backward at 0.8: a layer's GEMMs
    # take 1/3 / 1.0 + 2/3 / 0.8 of the curve's time, a rate of 0.857
    curve = [Timing(1e12, 2e-3)]
    fp8 = {"forward": [Timing(1e12, 1.0e-3)], "backward": [Timing(1e12, 1.25e-3)]}
    ratio, by_pass = build.fp8_matmul_ratio(fp8, curve, 2e15, 1e15)
    assert by_pass == pytest.approx({"forward": 1.0, "backward": 0.8})
    assert ratio == pytest.approx(1.0 / (1.0 / 3.0 / 1.0 + 2.0 / 3.0 / 0.8))
    # Transformer Engine's and torchao's choice: fast accumulation forward only
    assert compute.FP8_FAST_ACCUM == {"forward": True, "backward": False}


def test_fp8_at_a_size_the_curve_lacks_is_refused() -> None:
    with pytest.raises(Exception, match="none of which the matmul curve measured"):
        build.fp8_matmul_ratio({"forward": [Timing(3e11, 1e-3)]}, [Timing(1e11, 1e-3)],
                               2e15, 1e15)


def _assembled(fp8: list[Timing] | None) -> dict:
    """A CPU profile assembled from cpu-gloo with a stated fp8 peak of twice the measured
    curve's best (its 16-bit peak on a CPU), so each FP8 time sets a known figure."""
    base = copy.deepcopy(read_yaml(find(PROFILES, "cpu-gloo"), "base"))
    matmul = [Timing(1e9, 1e-1), Timing(2e9, 1e-1)]  # best 2e10 FLOP/s: the CPU's peak
    base["device"]["peak_flops_per_s"]["fp8"] = 4e10
    timings = None if fp8 is None else {"forward": fp8, "backward": fp8}
    return build.assemble(base, "t", torch.device("cpu"), "fp32", matmul, 1e10, 1e10, 1e-6,
                          {}, 1e9, 1e8, True, None, timings)


def test_a_measured_figure_goes_into_the_profile_it_loads_from() -> None:
    # FP8 at 2e9 FLOPs in 0.0625 s: 3.2e10 of a 4e10 peak, 0.8; the curve there is at 1.0
    prof = _assembled([Timing(2e9, 0.0625)])
    assert prof["efficiency"]["fp8_matmul"] == pytest.approx(0.8)
    record = prof["measured"]["fp8_matmul"]
    assert record["applied"] is True and record["forward_ratio"] == pytest.approx(0.8)
    assert record["backward_gemms"] == [[2e9, 0.0625]]
    assert profile_from_dict(prof).efficiency.fp8_matmul == pytest.approx(0.8)


def test_a_figure_no_profile_loads_keeps_the_base_and_says_so() -> None:
    # FP8 at 4x the curve's share: the base's fp8 peak is below what the GPU reached (a 16-bit
    # figure filed as fp8), not a measurement the loader takes
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
    assert compute.time_fp8(torch.device("cpu"), {}, quick=True) == (
        None, "a CPU runs no FP8 plan")


def test_a_rocm_gpu_times_no_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    # MI300 reports capability 9.4 but its FP8 types are e4m3fnuz: not this timing's operands
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    why = compute.fp8_unavailable(torch.device("cuda", 0),
                                  {"device": {"peak_flops_per_s": {"fp8": 2.6e15}}})
    assert "ROCm" in (why or "")


def test_an_fp8_gemm_that_fails_is_a_reason_not_the_end_of_the_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compute, "fp8_unavailable", lambda device, base: None)

    def fails(*args, **kwargs):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul\nmore")

    monkeypatch.setattr(compute, "measure_fp8_matmul", fails)
    timings, why = compute.time_fp8(torch.device("cuda", 0), {}, quick=True)
    assert timings is None
    assert why == ("torch._scaled_mm failed: CUBLAS_STATUS_NOT_SUPPORTED when calling "
                   "cublasLtMatmul")
