"""Matmul throughput by problem size and memory bandwidth, on CPU (one thread, as one runtime
rank runs) or on a CUDA device (timed with CUDA events)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
