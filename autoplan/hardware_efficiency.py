"""A hardware profile's efficiency figures: the Curve and TimeTable tables, fused attention's
figures by kernel, measured collective times and the Efficiency block that holds them, each
checked on load; hardware.ClusterProfile joins them to the datasheet figures (hardware_devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.errors import ConfigError
from autoplan.hardware_devices import PEAK_DTYPES, key_field

ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "sdpa-cpu")
"""Kernels a profile files attention figures under (alone or as "kernel@dtype"):
cost.runtime_kinds.ATTENTION_KERNELS less fa-triton, which attention_kernels.attention_efficiency prices
from fa2's figures."""

# Upper bounds far outside any real hardware (host costs are microseconds per operator;
# hardware_devices bounds the peak FLOP/s alike): a value past them is a typo or a unit slip,
# refused on load instead of scoring plans that are off by orders of magnitude.
MAX_OVERHEAD_S = 1.0
MAX_FP8_MATMUL = 1.5
"""Efficiency.fp8_matmul's bound: FP8 GEMMs half as fast again as the curve is no measurement."""


def _fraction(field: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(field, f"got {value!r}", "expected a fraction from 0 to 1")


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
                _check_kernel(f"{table}.{key_field(kernel)}", kernel)
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
    (cost.dp_comm._zero_traffic). The GPU datasheet profiles set 1: collectives run on their
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
    (runtimes.RuntimeTraits). null: a share of the GEMM efficiency (attention_kernels.FLASH_EFFICIENCY)."""
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

    fp8_matmul: float = 1.0
    """FP8 GEMMs' share of the fp8 peak over the share `matmul` gives a GEMM of that shape: the
    device's FP8 tensor-core path under cuBLASLt, measured against the curve (benchmarks/
    gemm_published.py derives it from published cuBLASLt FP8 tables; H100 and H200 reach 4-6%
    less of their FP8 peak than the curve's 16-bit share). It scales every FP8 GEMM the cost
    model prices (cost.block_time.profile_gemm_peak); a runtime whose FP8 kernels are not
    cuBLASLt's scales it again (RuntimeTraits.fp8_gemm_efficiency); `autoplan profile` times
    it on a CUDA GPU with FP8 tensor cores whose base profile states an fp8 peak
    (profiler.build.fp8_matmul_ratio), writing the figure where it lies in (0,
    MAX_FP8_MATMUL], and elsewhere keeps its base profile's. 1: FP8 GEMMs as the curve (a
    device nobody measured in FP8)."""

    nvls_all_reduce: Curve | None = None
    """NCCL's NVLink SHARP (NVLS) all-reduce inside a node, where the NVSwitch reduces in the
    switch (HGX/DGX H100 and H200): its algorithm bandwidth (message bytes over seconds) as a
    share of intra_node.bytes_per_s, by message bytes, as an 8-GPU group measured it (NVLS is
    all-reduce over NVLink only: NVIDIA/nccl #1031). NCCL turns it on where the system has it
    (NCCL_NVLS_ENABLE's default) and runs each all-reduce on whichever algorithm is faster, so
    a group inside a node takes the faster of it and the ring (comm.collective_time_s). null: no
    NVLS (A100's NVSwitch, PCIe, a CPU, or a cluster whose jobs set NCCL_NVLS_ENABLE=0)."""

    def __post_init__(self) -> None:
        for table in ("attention_forward", "attention_backward"):
            for kernel, value in (getattr(self, table) or {}).items():
                _check_kernel(f"{table}.{key_field(kernel)}", kernel)
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
        if not 0.0 < self.fp8_matmul <= MAX_FP8_MATMUL:
            raise ConfigError("fp8_matmul", f"got {self.fp8_matmul!r}",
                              f"expected a ratio above 0 and at most {MAX_FP8_MATMUL:g} of the "
                              "curve's rate (0.96: FP8 GEMMs 4% slower than the curve at the "
                              "fp8 peak)")
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
