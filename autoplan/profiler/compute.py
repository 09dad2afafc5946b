"""Matmul throughput by problem size (16-bit or fp32, and FP8 where the GPU has FP8 tensor
cores) and memory bandwidth, on CPU (one thread, as one runtime rank runs) or on a CUDA device
(timed with CUDA events)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_CAPABILITY = (8, 9)
"""The first CUDA compute capability with FP8 tensor cores (Ada, sm_89; Hopper and later)."""
TRAINING_GEMM_FLOPS = 1e11
TRAINING_GEMM_DIM = 1024
"""The GEMMs FP8 is timed at stand for a training block's (tokens x hidden x hidden or ffn): at
least this many FLOPs and every dimension at least this wide, the rule benchmarks/
gemm_published.py reads published FP8 tables by."""


@dataclass(frozen=True)
class Timing:
    size: float
    """FLOPs of one GEMM or bytes of one transfer."""
    seconds: float
    """Median seconds of one call."""


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2
              ) -> float:
    """Median seconds of `fn()`: CUDA events on a GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[len(samples) // 2]


def matmul_sizes(device: torch.device, quick: bool) -> list[int]:
    if device.type == "cuda":
        sizes = [128, 256, 512, 1024, 2048, 4096, 8192]
    else:
        sizes = [32, 64, 128, 256, 512, 1024]
    if not quick:
        return sizes
    picked = sizes[::2]  # every other size, and the largest once (a curve's x must increase)
    return picked if picked[-1] == sizes[-1] else picked + sizes[-1:]


def measure_matmul(device: torch.device, precision: str, quick: bool) -> list[Timing]:
    """Square GEMMs n x n x n at growing n; size is 2n^3 FLOPs."""
    dtype = DTYPES[precision]
    out = []
    for n in matmul_sizes(device, quick):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        flops = 2.0 * n**3
        repeats = 5 if quick else 10
        inner = max(1, int(2e8 / flops)) if device.type == "cpu" else max(1, int(5e10 / flops))

        def run(a: torch.Tensor = a, b: torch.Tensor = b, inner: int = inner) -> None:
            for _ in range(inner):
                torch.mm(a, b)

        out.append(Timing(flops, time_call(run, device, repeats) / inner))
    return out


def fp8_sizes(device: torch.device, quick: bool) -> list[int]:
    """The square sizes of matmul_sizes of a training block's GEMM (TRAINING_GEMM_FLOPS,
    TRAINING_GEMM_DIM): 4096 and 8192 on a GPU, 8192 alone with --quick."""
    return [n for n in matmul_sizes(device, quick)
            if 2.0 * n**3 >= TRAINING_GEMM_FLOPS and n >= TRAINING_GEMM_DIM]


def fp8_unavailable(device: torch.device, base: dict[str, Any]) -> str | None:
    """Why FP8 GEMMs are not timed here (None: they are): a CPU, a ROCm GPU (its FP8 types are
    the e4m3fnuz variants, which this timing does not build), a GPU without FP8 tensor cores
    (FP8_CAPABILITY), a base profile without an fp8 peak to state them against, or a torch
    without torch._scaled_mm."""
    if device.type != "cuda":
        return "a CPU runs no FP8 plan"
    if torch.version.hip is not None:
        return "ROCm's FP8 GEMMs are not timed (their types are e4m3fnuz)"
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_CAPABILITY:
        return (f"compute capability {capability[0]}.{capability[1]} has no FP8 tensor cores "
                f"(from {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]})")
    peaks = (base.get("device") or {}).get("peak_flops_per_s") or {}
    if "fp8" not in peaks:
        return "the base profile has no fp8 peak"
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    return None


def fp8_operands(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two n x n e4m3 operands of random values, the second column-major (the layout
    cuBLASLt's FP8 GEMM takes its second operand in)."""
    e4m3 = torch.float8_e4m3fn
    return (torch.randn(n, n, device=device).to(e4m3),
            torch.randn(n, n, device=device).to(e4m3).t())


FP8_FAST_ACCUM = {"forward": True, "backward": False}
"""The accumulation FP8 training runs each GEMM with: the forward's (fprop) in the tensor
cores' fast accumulation, the backward's (dgrad, wgrad) promoting partial sums to fp32
(Transformer Engine pytorch/module/base.py: _2X_ACC_FPROP False, _2X_ACC_DGRAD and
_2X_ACC_WGRAD True; torchao's Float8Linear: use_fast_accum for the output only)."""


def fp8_gemm(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
             fast_accum: bool = False) -> torch.Tensor:
    """a @ b in FP8 with per-tensor scales `scale` (a float32 scalar), a bf16 output and the
    tensor cores' fast accumulation or not: torch._scaled_mm, the cuBLASLt FP8 GEMM Transformer
    Engine and torchao's float8 training call."""
    return torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16,
                            use_fast_accum=fast_accum)


def measure_fp8_matmul(device: torch.device, sizes: list[int], quick: bool,
                       fast_accum: bool = False) -> list[Timing]:
    """Square FP8 GEMMs n x n x n (fp8_operands, fp8_gemm with scales of 1 and `fast_accum`)
    at each of `sizes`; size is 2n^3 FLOPs."""
    one = torch.ones((), device=device)
    out = []
    for n in sizes:
        a, b = fp8_operands(n, device)
        flops = 2.0 * n**3
        inner = max(1, int(2e8 / flops)) if device.type == "cpu" else max(1, int(5e10 / flops))

        def run(a: torch.Tensor = a, b: torch.Tensor = b, inner: int = inner) -> None:
            for _ in range(inner):
                fp8_gemm(a, b, one, fast_accum)

        out.append(Timing(flops, time_call(run, device, 5 if quick else 10) / inner))
    return out


def time_fp8(device: torch.device, base: dict[str, Any], quick: bool
             ) -> tuple[dict[str, list[Timing]] | None, str | None]:
    """(FP8 GEMM timings by pass, FP8_FAST_ACCUM's keys, None) where this device times them
    (fp8_unavailable), else (None, why not); a GEMM that fails (a driver or torch build
    without this FP8 path) is a reason, not the end of a profile that took minutes."""
    why = fp8_unavailable(device, base)
    if why is not None:
        return None, why
    try:
        return {part: measure_fp8_matmul(device, fp8_sizes(device, quick), quick, fast)
                for part, fast in FP8_FAST_ACCUM.items()}, None
    except RuntimeError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return None, f"torch._scaled_mm failed: {first[:200]}"


def measure_bandwidth(device: torch.device, quick: bool) -> tuple[float, float]:
    """(copy bytes/s, element-wise bytes/s) on a tensor far larger than the caches."""
    numel = 64 * 2**20 if device.type == "cpu" else 512 * 2**20  # 256 MiB / 2 GiB
    src = torch.randn(numel, device=device)
    other = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    copy_s = time_call(lambda: dst.copy_(src), device, 3 if quick else 5)
    add_s = time_call(lambda: torch.add(src, other, out=dst), device, 3 if quick else 5)
    size = src.element_size() * numel
    return 2.0 * size / copy_s, 3.0 * size / add_s  # copy: read + write; add: 2 reads + write
