"""A profile's datasheet figures for one node: the device (memory, bandwidth, dense peak per
dtype), its two link tiers and its host, each checked on load. hardware_efficiency.py holds the
efficiency curves, hardware.py the ClusterProfile that joins these to them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.errors import ConfigError
from autoplan.yaml_io import show

PEAK_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
"""Keys of device.peak_flops_per_s: plan.Precision's values (what the cost model asks
DeviceSpec.peak for) and tf32, the datasheets' fp32 tensor-core peak."""

# An upper bound far outside any real hardware (2026: ~5e15 dense FP8 FLOP/s per GPU): a value
# past it is a typo or a unit slip, refused on load instead of scoring plans that are off by
# orders of magnitude (hardware_efficiency.py bounds the overheads, hardware.py the GPUs per node).
MAX_PEAK_FLOPS_PER_S = 1e17


def check_positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, f"got {value!r}", "expected a positive number")


def key_field(key: Any) -> str:
    """A mapping key for an error's field: as written when it is a short printable word."""
    ok = isinstance(key, str) and key.isprintable() and key.strip() and len(key) <= 60
    return key if ok else show(key, 60)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    """Marketing name of the accelerator."""
    memory_bytes: int
    """Device memory a process can allocate from: cudaMemGetInfo's total (torch's
    `total_memory`, the "total capacity" of its out-of-memory message), which is below the
    datasheet's figure and nvidia-smi's by what the driver keeps (79.35 GiB on an A100 80GB).
    `reserved_bytes` come out of it."""
    hbm_bytes_per_s: float
    """Peak device-memory bandwidth."""
    peak_flops_per_s: dict[str, float]
    """Dense peak per dtype: bf16, fp16, fp32 (and tf32 where it exists)."""
    reserved_bytes: int = 0
    """Memory the runtime holds before the model: CUDA context, NCCL and cuBLAS workspaces."""
    sm_count: int | None = None
    """Streaming multiprocessors (datasheet). With it the cost model prices the tile and wave
    quantization of each GEMM (NVIDIA, "Matrix Multiplication Background User's Guide"); null
    (CPUs): no quantization."""
    gemm_tile: tuple[int, int] = (256, 128)
    """Output tile (rows, columns) one SM computes at a time for large 16-bit GEMMs: cuBLAS's
    largest tensor-core tiles on Volta to Hopper (the guide's examples use 256 x 128)."""

    def __post_init__(self) -> None:
        check_positive("memory_bytes", self.memory_bytes)
        check_positive("hbm_bytes_per_s", self.hbm_bytes_per_s)
        if not self.peak_flops_per_s:
            raise ConfigError("peak_flops_per_s", "is empty", "give at least one dtype")
        for k, v in self.peak_flops_per_s.items():
            if k not in PEAK_DTYPES:
                raise ConfigError(f"peak_flops_per_s.{key_field(k)}", "unknown dtype",
                                  f"use one of {', '.join(PEAK_DTYPES)} (lower case)")
            check_positive(f"peak_flops_per_s.{k}", v)
            if v > MAX_PEAK_FLOPS_PER_S:
                raise ConfigError(f"peak_flops_per_s.{k}", f"got {v:g}",
                                  f"expected FLOP/s of one device, at most "
                                  f"{MAX_PEAK_FLOPS_PER_S:g}")
        if self.sm_count is not None and self.sm_count < 1:
            raise ConfigError("sm_count", f"got {self.sm_count}", "expected a positive integer")
        if len(self.gemm_tile) != 2 or min(self.gemm_tile) < 1:
            raise ConfigError("gemm_tile", f"got {list(self.gemm_tile)}",
                              "expected [rows, columns], both positive")
        if not 0 <= self.reserved_bytes < self.memory_bytes:
            raise ConfigError("reserved_bytes", f"got {self.reserved_bytes}",
                              f"expected 0 or more bytes, below memory_bytes "
                              f"({self.memory_bytes})")

    def peak(self, precision: str) -> float:
        if precision not in self.peak_flops_per_s:
            raise ConfigError("peak_flops_per_s", f"has no {precision!r} entry",
                              f"add one (have {', '.join(self.peak_flops_per_s)})")
        return self.peak_flops_per_s[precision]


@dataclass(frozen=True)
class LinkSpec:
    bytes_per_s: float
    """Unidirectional bandwidth available to one GPU on this link tier."""
    latency_s: float
    """Per-message latency (one hop)."""

    def __post_init__(self) -> None:
        check_positive("bytes_per_s", self.bytes_per_s)
        if self.latency_s < 0:
            raise ConfigError("latency_s", f"got {self.latency_s}", "expected >= 0 seconds")


@dataclass(frozen=True)
class HostSpec:
    memory_bytes: int
    """Host (CPU) memory per node."""
    pcie_bytes_per_s: float
    """Host <-> one GPU copy bandwidth (pinned memory)."""
    optimizer_params_per_s: float
    """Parameters per second the node's CPUs update with Adam (shared by its GPUs; offload)."""

    compute_slots: int | None = None
    """Ranks one node can run at once without time-sharing (CPU cores for a CPU profile, each
    rank using one thread); more ranks than this slow every rank proportionally. null: every
    GPU is its own device."""

    def __post_init__(self) -> None:
        if self.compute_slots is not None and self.compute_slots < 1:
            raise ConfigError("compute_slots", f"got {self.compute_slots}",
                              "expected a positive integer or null")
        check_positive("memory_bytes", self.memory_bytes)
        check_positive("pcie_bytes_per_s", self.pcie_bytes_per_s)
        check_positive("optimizer_params_per_s", self.optimizer_params_per_s)
