"""Hardware: devices, links, hosts and efficiency curves, loaded from profiles/NAME.yaml.

A profile describes one node type; the GPU count of a job is given separately (ClusterSpec).
Datasheet presets carry reasonable efficiency curves; `autoplan profile` writes measured ones.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.yaml_io import (
    check_schema_version,
    from_dict,
    name_hint,
    read_yaml,
    show,
    unknown_key_fix,
)

log = logging.getLogger(__name__)

PROFILES_DIR = resources.package_dir(resources.PROFILES)
"""The built-in profiles (package data); a user directory is searched first (autoplan.resources)."""

PEAK_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
"""Keys of device.peak_flops_per_s: plan.Precision's values (what the cost model asks
DeviceSpec.peak for) and tf32, the datasheets' fp32 tensor-core peak."""
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "sdpa-cpu")
"""Kernels a profile files attention figures under (alone or as "kernel@dtype"):
cost.runtime_kinds.ATTENTION_KERNELS less fa-triton, which compute.attention_efficiency prices
from fa2's figures."""
MEASURED_KEYS = ("date", "torch", "device", "precision", "quick", "threads_per_rank", "matmul",
                 "copy_bytes_per_s", "elementwise_bytes_per_s", "op_overhead_s", "collectives",
                 "host_copy_bytes_per_s", "cpu_adam_params_per_s")
"""Keys of `measured` that `autoplan profile` always writes (profiler/build.py assemble)."""
MEASURED_EXTRA_KEYS = ("layer_models", "layers", "saved_activations", "matmul_from_layers",
                       "dispatch", "calibration")
"""Keys it writes when it measured them (build.py), and `autoplan calibrate`'s record."""
MEASURED_ALONE_KEYS = ("dispatch", "precision", "calibration")
"""Sections written into any profile on their own (profiler dispatch.apply_dispatch and
precision.apply_precision, `autoplan calibrate` on a datasheet profile): a `measured` holding
only these needs none of MEASURED_KEYS' others."""

# Upper bounds far outside any real hardware (2026: ~5e15 dense FP8 FLOP/s per GPU, 72 GPUs in
# the largest NVLink domain, microseconds per operator): a value past them is a typo or a unit
# slip, refused on load instead of scoring plans that are off by orders of magnitude.
MAX_PEAK_FLOPS_PER_S = 1e17
MAX_OVERHEAD_S = 1.0
MAX_GPUS_PER_NODE = 1024


def _positive(field: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(field, f"got {value!r}", "expected a positive number")


def _fraction(field: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(field, f"got {value!r}", "expected a fraction from 0 to 1")


def _key(key: Any) -> str:
    """A mapping key for an error's field: as written when it is a short printable word."""
    ok = isinstance(key, str) and key.isprintable() and key.strip() and len(key) <= 60
    return key if ok else show(key, 60)


def _check_sizes(x: tuple[float, ...], y: tuple[float, ...]) -> None:
    """x and y of a table: the same non-zero length, x positive and strictly increasing.
    Fields are named relative to the table (the loader puts its own path in front)."""
    if len(x) != len(y) or not x:
        raise ConfigError("x", f"has {len(x)} points, y {len(y)}",
                          "give x and y of the same, non-zero length")
    if any(v <= 0 for v in x) or any(b <= a for a, b in zip(x, x[1:], strict=False)):
        raise ConfigError("x", f"got {list(x)}", "use increasing positive sizes")


@dataclass(frozen=True)
class Curve:
    """A monotone table y(x), interpolated linearly in log(x) and clamped at both ends."""

    x: tuple[float, ...]
    """Sizes (FLOPs of one matmul, or bytes of one message), strictly increasing, > 0."""
    y: tuple[float, ...]
    """Values at those sizes (efficiencies are fractions of the peak, in (0, 1])."""

    def __post_init__(self) -> None:
        _check_sizes(self.x, self.y)
        if any(not 0 < v <= 1.0 for v in self.y):
            raise ConfigError("y", f"got {list(self.y)}", "efficiencies lie in (0, 1]")

    def __call__(self, x: Any) -> np.ndarray:
        logx = np.log(np.maximum(np.asarray(x, dtype=np.float64), 1e-30))
        return np.interp(logx, np.log(np.asarray(self.x)), np.asarray(self.y))

    def scaled(self, share: float) -> Curve:
        """The same table with every value times `share`."""
        return Curve(self.x, tuple(v * share for v in self.y))


AttentionFigure = float | Curve
"""One fused-attention figure: a share of the peak at training lengths, or a Curve of shares
over the sequence length the kernel attends over (tokens per sequence, queries = keys)."""


def scale_figure(figure: AttentionFigure, share: float) -> AttentionFigure:
    return figure.scaled(share) if isinstance(figure, Curve) else figure * share


ATTENTION_HEAD_DIM = 128
"""Head dimension of Efficiency.attention_forward/backward's figures: the width the kernels'
papers measure by default and most models of 7B and up use."""


@dataclass(frozen=True)
class AttentionFigures:
    """Fused attention's achieved / peak FLOP/s at one head dimension, by kernel."""

    forward: dict[str, AttentionFigure]
    backward: dict[str, AttentionFigure]

    def __post_init__(self) -> None:
        for table in ("forward", "backward"):
            for kernel, value in getattr(self, table).items():
                _check_kernel(f"{table}.{_key(kernel)}", kernel)
                if not isinstance(value, Curve) and not 0 < value <= 1:
                    raise ConfigError(f"{table}.{kernel}", f"got {value!r}",
                                      "expected a fraction of the peak in (0, 1]")

    def scaled(self, share: float) -> AttentionFigures:
        return AttentionFigures({k: scale_figure(v, share) for k, v in self.forward.items()},
                                {k: scale_figure(v, share) for k, v in self.backward.items()})


@dataclass(frozen=True)
class TimeTable:
    """Measured seconds of one collective by message bytes, interpolated in log-log between the
    points and extended past the largest one at the bandwidth of the last segment."""

    x: tuple[float, ...]
    """Message bytes, strictly increasing, > 0 (the full message: the all-reduced buffer, the
    gathered output of an all-gather, the input of a reduce-scatter, one point-to-point send)."""
    y: tuple[float, ...]
    """Seconds at those sizes, > 0 and non-decreasing (`autoplan profile` cleans its samples)."""

    def __post_init__(self) -> None:
        _check_sizes(self.x, self.y)
        if len(self.x) < 2:  # one point prices every message size the same
            raise ConfigError("x", f"has {len(self.x)} point",
                              "measure at least two message sizes")
        if any(v <= 0 for v in self.y) or any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ConfigError("y", f"got {list(self.y)}",
                              "use positive seconds that do not fall with message size")

    def __call__(self, nbytes: Any) -> np.ndarray:
        x = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
        xs, ys = np.asarray(self.x), np.asarray(self.y)
        inside = np.exp(np.interp(np.log(x), np.log(xs), np.log(ys)))
        if len(xs) < 2:
            return inside
        # seconds per byte past the table: the last rising segment's, never below the
        # largest message's average (a cleaned table can end flat)
        rising = [i for i in range(len(xs) - 1) if ys[i + 1] > ys[i]]
        last = rising[-1] if rising else len(xs) - 2
        slope = max((ys[last + 1] - ys[last]) / (xs[last + 1] - xs[last]), ys[-1] / xs[-1])
        return np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * slope, inside)


@dataclass(frozen=True)
class CollectiveTimes:
    """Seconds per call measured on this machine by `autoplan profile`, per group size (ranks
    inside one node, each group measured with only its own ranks running). Where a table
    exists the cost model reads it instead of the ring formula: it holds what the formula
    leaves out, such as each kind's fixed cost per call."""

    all_reduce: dict[int, TimeTable] | None = None
    all_gather: dict[int, TimeTable] | None = None
    reduce_scatter: dict[int, TimeTable] | None = None
    all_to_all: dict[int, TimeTable] | None = None
    send_recv: dict[int, TimeTable] | None = None

    def __post_init__(self) -> None:
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
            for size in (getattr(self, kind) or {}):
                if size < 2:
                    raise ConfigError(f"collectives.{kind}", f"group size {size}",
                                      "measure groups of 2 or more ranks")

    def table(self, kind: str) -> dict[int, TimeTable]:
        return getattr(self, kind) or {}


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
        _positive("memory_bytes", self.memory_bytes)
        _positive("hbm_bytes_per_s", self.hbm_bytes_per_s)
        if not self.peak_flops_per_s:
            raise ConfigError("peak_flops_per_s", "is empty", "give at least one dtype")
        for k, v in self.peak_flops_per_s.items():
            if k not in PEAK_DTYPES:
                raise ConfigError(f"peak_flops_per_s.{_key(k)}", "unknown dtype",
                                  f"use one of {', '.join(PEAK_DTYPES)} (lower case)")
            _positive(f"peak_flops_per_s.{k}", v)
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
        _positive("bytes_per_s", self.bytes_per_s)
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
        _positive("memory_bytes", self.memory_bytes)
        _positive("pcie_bytes_per_s", self.pcie_bytes_per_s)
        _positive("optimizer_params_per_s", self.optimizer_params_per_s)


@dataclass(frozen=True)
class Efficiency:
    matmul: Curve
    """Achieved / peak FLOP/s of one GEMM by its FLOPs (2*m*n*k)."""
    memory_bound: float = 0.7
    """Achieved / peak HBM bandwidth of element-wise and normalisation kernels."""
    intra_node: Curve | None = None
    """Achieved / link bandwidth of a collective by message bytes, inside a node."""
    inter_node: Curve | None = None
    """Achieved / link bandwidth of a collective by message bytes, across nodes."""
    overlap: float = 0.8
    """Share of the compute beside them that overlapped data-parallel collectives can use
    (cost.step_time._zero_traffic). The GPU datasheet profiles set 1: collectives run on their
    own stream as soon as their unit is ready, the first gather and last reduction of a step
    are priced as exposed, and what the collectives take from the compute is comm_slowdown.
    Below 1 is a measured profile's fit (`autoplan calibrate`), or the 0.8 default for a
    profile that says nothing."""
    comm_slowdown: float = 0.0
    """How much longer compute takes while a collective kernel runs beside it (0.189: 18.9%
    longer). NCCL runs each channel of a collective as a thread block on an SM, which the GEMM
    or attention kernel beside it can no longer use, and both share HBM; a hidden collective
    therefore costs hidden * s / (1 + s) seconds of compute (comm.contention_s). 0: overlap is
    free (a CPU profile, whose overlap is 0 anyway, or hardware nobody measured)."""
    op_overhead_s: float = 0.0
    """Host-side seconds to dispatch one operator that nothing hides: eager PyTorch on a CPU
    pays it for every op (measured by `autoplan profile`); on a GPU, launches of the large
    kernels these datasheet profiles are for overlap with execution, so they leave it at 0."""
    dtensor_op_overhead_s: float = 0.0
    """Extra host seconds per operator on a DTensor (tensor parallelism): sharding propagation
    runs in Python for every op (measured by `autoplan profile` on the runtime's block)."""
    checkpoint_op_overhead_s: float = 0.0
    """Extra host seconds per forward operator of a fully recomputed block beyond redoing the
    forward: saved-tensor hooks and recompute bookkeeping of torch.utils.checkpoint."""
    selective_op_overhead_s: float = 0.0
    """Extra host seconds per forward operator of a selectively recomputed block beyond
    redoing its non-GEMM ops: the checkpoint policy is a Python callback on every op."""
    fsdp_unit_overhead_s: float = 0.0
    """Extra host seconds per FSDP2 unit and micro-batch: its pre/post forward and backward
    hooks and the copies into and out of the communication buffers (measured)."""
    optimizer_overhead_s: float = 0.0
    """Host seconds per parameter tensor of the step after backward (gradient norm, optimizer,
    zero_grad) beyond its memory traffic (measured)."""
    dtensor_optimizer_overhead_s: float = 0.0
    """Extra host seconds per parameter tensor of that step when the parameters are DTensors
    (FSDP2 or tensor parallelism): each op dispatches through DTensor per tensor."""
    tp_collective_overhead_s: float = 0.0
    """Extra host seconds per tensor-parallel collective issued through DTensor (a redistribute
    of a Partial or Shard placement) over the plain collective of the same bytes, charged per
    call cost.comm.TP_CALLS counts (measured by `autoplan profile` over 2 CPU ranks,
    profiler/dtensor_collectives.py; 0 on a GPU, where kernels of real size hide it)."""
    attention_forward: dict[str, AttentionFigure] | None = None
    """Achieved / peak FLOP/s of fused attention's forward by kernel (fa2, fa3, cudnn): one share
    at training lengths (2K-8K tokens, head dim 128; causal work counted once, as the kernels'
    papers count it), or, where a paper measured the kernel by length, a Curve over the tokens
    per sequence the kernel attends over ({x: lengths, y: shares}: short sequences run slower,
    each query block iterating over fewer key blocks). Which kernel runs is the runtime's
    (runtimes.RuntimeTraits). null: a share of the GEMM efficiency (compute.FLASH_EFFICIENCY)."""
    attention_backward: dict[str, AttentionFigure] | None = None
    """The same for the backward, whose FLOPs are counted as 2.5x the forward's."""
    attention_clock: float = 1.0
    """The clock a training step runs the attention kernels at over the clock their figures
    (attention_forward/backward, attention_head_dims) were measured at. The papers' figures are
    single-GPU kernel benchmarks, which run at the boost clock; inside a step every GPU of the
    node is loaded at its power cap, and the kernel runs at the clock the step's GEMMs hold
    there, as the matmul curve's top already does (the datasheet profiles file the loaded-node
    over burst ratio the matmul top carries). 1: the attention figures and the matmul curve
    stand at one clock (a profile `autoplan profile` measured: on a CPU it times the GEMMs and
    the kernel alike; on a GPU its GEMMs, timed on one GPU, run at the burst clock of the
    papers' figures it keeps)."""
    attention_head_dims: dict[int, AttentionFigures] | None = None
    """The kernels' figures at head dimensions narrower than ATTENTION_HEAD_DIM, by head dim:
    a narrow head gives each tile's two GEMMs a short inner dimension, so the kernels reach a
    smaller share of the peak (FlashAttention-3's paper measures 64 beside 128). A model's
    head width between two filed dims reads their figures linearly in the width; below the
    narrowest, that one's; a kernel filed here only at 128 is read at 128."""

    def __post_init__(self) -> None:
        for table in ("attention_forward", "attention_backward"):
            for kernel, value in (getattr(self, table) or {}).items():
                _check_kernel(f"{table}.{_key(kernel)}", kernel)
                if isinstance(value, Curve):  # its shares are checked to lie in (0, 1]
                    continue
                # "kernel@dtype" entries are measured against that dtype's peak, which a CPU
                # profile infers from its GEMMs (profiler/precision.py): a kernel may beat it
                measured = "@" in kernel
                if not (0 < value if measured else 0 < value <= 1):
                    raise ConfigError(f"{table}.{kernel}", f"got {value!r}",
                                      "expected a share of the peak above 0" if measured
                                      else "expected a fraction of the peak in (0, 1]")
        for dim in self.attention_head_dims or {}:
            if not 0 < dim < ATTENTION_HEAD_DIM:
                raise ConfigError(f"attention_head_dims.{dim}", "not a narrower head dim",
                                  f"file head dims between 1 and {ATTENTION_HEAD_DIM - 1}: "
                                  f"attention_forward/backward hold head dim {ATTENTION_HEAD_DIM}")
        _fraction("memory_bound", self.memory_bound)
        if self.memory_bound == 0:
            raise ConfigError("memory_bound", "got 0", "expected a fraction above 0")
        _fraction("overlap", self.overlap)
        if not 0.0 < self.attention_clock <= 1.0:
            raise ConfigError("attention_clock", f"got {self.attention_clock!r}",
                              "expected a clock ratio in (0, 1] (0.915 = 91.5% of the clock "
                              "the attention figures were measured at)")
        if not 0.0 <= self.comm_slowdown <= 1.0:
            raise ConfigError("comm_slowdown", f"got {self.comm_slowdown!r}",
                              "expected a slowdown in [0, 1] (0.2 = compute 20% longer)")
        for name in ("op_overhead_s", "dtensor_op_overhead_s", "checkpoint_op_overhead_s",
                     "selective_op_overhead_s", "fsdp_unit_overhead_s",
                     "optimizer_overhead_s", "dtensor_optimizer_overhead_s",
                     "tp_collective_overhead_s"):
            if not 0 <= getattr(self, name) < MAX_OVERHEAD_S:
                raise ConfigError(name, f"got {getattr(self, name)}",
                                  f"expected seconds per call, >= 0 and below {MAX_OVERHEAD_S:g}")


def _check_kernel(field: str, kernel: str) -> None:
    """An attention figure's key: a known kernel, or "kernel@dtype" with a known dtype."""
    name, at, dtype = kernel.partition("@")
    if name not in ATTENTION_KERNELS or (at and dtype not in PEAK_DTYPES):
        raise ConfigError(field, "unknown kernel",
                          f"use one of {', '.join(ATTENTION_KERNELS)}, alone or as "
                          f"KERNEL@DTYPE with DTYPE one of {', '.join(PEAK_DTYPES)}")


def _device_compute(measured: dict[str, Any] | None) -> float:
    """The compute multiplier between a calibrated profile's peak and its device's own:
    `autoplan calibrate`'s record (measured.calibration.device_compute, every fit in a chain;
    factors.compute in records of one fit written before it); 1 without a record."""
    calibration = (measured or {}).get("calibration")
    if calibration is None:
        return 1.0
    if not isinstance(calibration, dict):
        raise ConfigError("measured.calibration", f"got {show(calibration)}",
                          "expected the mapping `autoplan calibrate` wrote")
    factors = calibration.get("factors")
    if factors is not None and not isinstance(factors, dict):
        raise ConfigError("measured.calibration.factors", f"got {show(factors)}",
                          "expected the mapping of factors `autoplan calibrate` wrote")
    field, value = (("device_compute", calibration["device_compute"])
                    if "device_compute" in calibration
                    else ("factors.compute", (factors or {}).get("compute", 1.0)))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(f"measured.calibration.{field}", f"got {value!r}",
                          "expected the positive multiplier `autoplan calibrate` wrote")
    return float(value)


def _check_measured(measured: dict[str, Any]) -> None:
    """`measured` holds what `autoplan profile` writes, or only sections of MEASURED_ALONE_KEYS:
    its presence turns off the datasheet GEMM quantization (cost.compute.gemm_time_s), so a
    stray or empty section must not."""
    known = MEASURED_KEYS + MEASURED_EXTRA_KEYS
    for key in measured:
        if key not in known:
            raise ConfigError(f"measured.{_key(key)}", "unknown key",
                              unknown_key_fix(key, known))
    _device_compute(measured)  # a calibration record's multiplier, checked
    if measured and set(measured) <= set(MEASURED_ALONE_KEYS):
        return
    missing = [k for k in MEASURED_KEYS if k not in measured]
    if missing:
        raise ConfigError("measured", f"lacks {', '.join(missing)}" if measured else "is empty",
                          "keep the section `autoplan profile` wrote whole, or delete it")


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    device: DeviceSpec
    gpus_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    host: HostSpec
    efficiency: Efficiency
    description: str = ""
    collectives: CollectiveTimes | None = None
    """Measured seconds per collective call by size and group (CPU hosts and profiled GPUs)."""
    measured: dict[str, Any] | None = None
    """Written by `autoplan profile`: measured curves and the conditions they were taken in."""
    price_per_gpu_hour: float | None = None
    """US dollars per GPU-hour, an example list price for `search --objective cost` across GPU
    types (override with `search --price NAME=USD`); null: cost in GPU-hours only."""

    @property
    def is_cpu(self) -> bool:
        """A CPU host, whose ranks time-share its `host.compute_slots` cores, not a GPU node."""
        return self.host.compute_slots is not None

    @property
    def calibrated_compute(self) -> float:
        """The multiplier `autoplan calibrate` folded into device.peak_flops_per_s, over every
        fit of a chain (a calibrated profile calibrated again); 1 for a profile it did not fit.
        The fitted peak times the profile's efficiencies is the rate plans are priced at; MFU is
        stated against the device's own peak, this divided back out (cost.estimate)."""
        return _device_compute(self.measured)

    def __post_init__(self) -> None:
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError("gpus_per_node", f"got {self.gpus_per_node}",
                              f"expected 1 to {MAX_GPUS_PER_NODE} GPUs in one node")
        if self.measured is not None:
            _check_measured(self.measured)
        price = self.price_per_gpu_hour
        if price is not None and not (isinstance(price, (int, float)) and 0 < price < 1e6):
            raise ConfigError("price_per_gpu_hour", f"got {price!r}",
                              "expected US dollars per GPU-hour, e.g. 2.5, or null")


@dataclass(frozen=True)
class ClusterSpec:
    """A profile and a GPU count: the machine a plan is scored for."""

    profile: ClusterProfile
    num_gpus: int

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ConfigError("--num-gpus", f"got {self.num_gpus}", "expected a positive integer")

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.profile.gpus_per_node)

    @property
    def gpus_per_node(self) -> int:
        return min(self.num_gpus, self.profile.gpus_per_node)


def available_profiles() -> list[str]:
    """Profile names: the user's directory and the built-in ones."""
    return resources.names(resources.PROFILES)


def profile_names() -> list[str]:
    """The names of available_profiles() that are profiles: less the plans, model specs and
    runtime-traits files kept beside them (not_a_profile), which `autoplan clusters` skips
    and --cluster's "choose one of" leaves out. A broken profile stays: it is one."""
    return [name for name in available_profiles()
            if (path := resources.find(resources.PROFILES, name)) is None
            or not_a_profile(path) is None]


@functools.cache
def other_files() -> tuple[tuple[str, frozenset[str]], ...]:
    """The other YAML files autoplan reads, by keys no profile holds (in this order: a plan's
    `offload:` is a traits key too)."""
    import dataclasses

    from autoplan.cost.runtimes import RuntimeTraits

    traits = frozenset(f.name for f in dataclasses.fields(RuntimeTraits)) - {"name",
                                                                              "description"}
    return (("a plan", frozenset({"model", "cluster", "batch", "parallel"})),
            ("a model spec", frozenset({"num_layers", "hidden_size", "num_heads", "vocab_size"})),
            ("runtime traits, for --runtime", traits))


def not_a_profile(path: str | Path) -> str | None:
    """What a YAML file in a profile folder is when it is no profile (no `device:`) but one
    of the other files autoplan reads (other_files: a runtime-traits file has `base:` or a
    traits key); None for anything else, a broken profile, which is said as one."""
    try:
        data = read_yaml(path, "profile")
    except ConfigError:
        return None
    if not isinstance(data, dict) or "device" in data:
        return None
    return next((what for what, keys in other_files() if not keys.isdisjoint(data)), None)


def profile_from_dict(data: Any, where: str = "profile") -> ClusterProfile:
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {data!r}", "expected a mapping of profile fields")
    return from_dict(ClusterProfile, check_schema_version(data, where), where)


def check_out_and_name(out: str | None, name: str | None, reader: str = "--cluster") -> None:
    """Refuse an empty --out or --name (`--out ''` wrote into the default folder) and an --out
    of a profile that `reader` (`--cluster`, `--profile`) could not read back: without a
    .yaml/.yml suffix a bare word is taken for a packaged profile name. `autoplan profile` and
    `autoplan calibrate` write profiles under this rule."""
    if name is not None and not name.strip():
        raise ConfigError("--name", "is empty", "give the profile a name, or leave --name out")
    if out is None:
        return
    if not out.strip():
        raise ConfigError("--out", "is empty", "give a path ending in .yaml, or leave --out out")
    if Path(out).suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError("--out", f"{show(out)} does not end in .yaml or .yml",
                          f"add .yaml: profiles are YAML files, and `{reader}` reads a bare "
                          "word as the name of a packaged profile")


def load_profile(ref: str | Path, flag: str = "--cluster") -> ClusterProfile:
    """A profile by name (the user's profile directory, then the built-in ones) or by path;
    `flag` names the option in errors about the reference, and every error about the file's
    contents names the profile and the file it was read from."""
    path = Path(ref)
    if resources.is_name(ref):
        named = resources.find(resources.PROFILES, str(ref))
        if named is None:
            known = profile_names()
            hint = _named_inside(str(ref)) or name_hint(str(ref), known)
            raise ConfigError(
                flag, f"unknown profile {show(str(ref))}",
                (f"{hint} " if hint else "")
                + f"choose one of {', '.join(known)} or a path to a profile YAML "
                f"({_looked_in()}; make one by running `autoplan profile --name "
                f"{ref if re.fullmatch(r'[A-Za-z0-9._-]+', str(ref)) else show(str(ref))}` on "
                "the machine, or copy a shipped one there and edit it)",
            )
        path = named
    # errors name the file: a user's profile may shadow a built-in name, a search read several
    where = f"profile {ref} ({path})" if resources.is_name(ref) else f"profile {str(path)!r}"
    profile = profile_from_dict(read_yaml(path, flag), where)
    if resources.is_name(ref) and profile.name != str(ref):
        _warn_inner_name(str(ref), str(path), profile.name)
    return profile


def _looked_in() -> str:
    """Where a profile name is looked up, for the unknown-profile line: the user's folder (and
    the variable that moves it), then the shipped ones."""
    return (f"looked in {resources.user_dir(resources.PROFILES)} (${resources.PROFILES.env} "
            "sets another folder), then the shipped ones")


_NAME_LINE = re.compile(r"^name:[ \t]*(['\"]?)([^'\"#\s]+)\1[ \t]*(?:#.*)?$", re.MULTILINE)
"""A profile file's top-level `name:` line, read without parsing the file (a hint only)."""


def _named_inside(name: str) -> str | None:
    """'did you mean ...?' for an unknown profile name that a profile file gives as its own
    `name:`: profiles are found by file name (`--cluster my-h100` reads my-h100.yaml), not by
    the name inside, so a user who named the profile in the file looked it up by that."""
    for folder in resources.search_dirs(resources.PROFILES):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            try:
                text = path.read_text(encoding="utf-8", errors="replace")[:100_000]
            except OSError:
                continue
            found = _NAME_LINE.search(text)
            if found and found.group(2) == name and resources.find(
                    resources.PROFILES, path.stem) == path and not_a_profile(path) is None:
                return (f"did you mean {path.stem!r}? {path} says name: {name}, but a profile "
                        "is found by its file name;")
    return None


@functools.cache
def _warn_inner_name(ref: str, path: str, inner: str) -> None:
    """Say once per file that its `name:` is not the name it is found by."""
    log.warning("profile %s (%s) says name: %s; a profile is found by its file name, so "
                "--cluster takes %s, not %s: rename the file %s.yaml, or set name: %s in it",
                ref, path, inner, ref, inner, inner, ref)


def cluster(ref: str | Path, num_gpus: int) -> ClusterSpec:
    return ClusterSpec(load_profile(ref), num_gpus)


