"""Host paths for offload: host<->device copy bandwidth and CPU Adam throughput."""

from __future__ import annotations

import torch

from autoplan.profiler.compute import time_call


def measure_copy_bandwidth(device: torch.device, quick: bool) -> float:
    """Bytes/s of a pinned host-to-device copy (a plain host copy on a CPU-only machine)."""
    numel = (16 if quick else 64) * 2**20
    if device.type == "cuda":
        host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
        dev = torch.empty(numel, dtype=torch.float32, device=device)
        seconds = time_call(lambda: dev.copy_(host, non_blocking=True), device, 5)
    else:
        src = torch.randn(numel)
        dst = torch.empty_like(src)
        seconds = time_call(lambda: dst.copy_(src), device, 5)
    return numel * 4 / seconds


def measure_cpu_adam(quick: bool, threads: int | None = None) -> float:
    """Parameters per second torch's AdamW (foreach) updates on the CPU."""
    if threads:
        torch.set_num_threads(threads)
    numel = (4 if quick else 16) * 2**20
    param = torch.nn.Parameter(torch.randn(numel))
    param.grad = torch.randn(numel)
    opt = torch.optim.AdamW([param], lr=1e-3, foreach=True)
    seconds = time_call(opt.step, torch.device("cpu"), 3 if quick else 5)
    return numel / seconds
