"""DTensor's host cost per tensor-parallel collective on CPU: a redistribute that issues one
collective, less the plain gloo call of the same bytes timed beside it in the same rounds of
collectives.py's 2-rank job. cost.comm charges TP_CALLS x the excess (tp_collective_overhead_s).
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any

import torch

SIZES = (16 * 2**10, 256 * 2**10)
"""Bytes per rank timed: around the closed loop's tiny plans' tensor-parallel activations
(micro-batch 4 x 64 tokens x hidden 64 in fp32 = 64 KiB, a sequence shard of it 32 KiB;
benchmarks/closed_loop.py, model_spec PRESETS["tiny"]), on collectives.message_sizes' grid."""
PREFIX = "dtensor_"
"""Result key of a kind's excess rows ([[bytes, seconds]]): PREFIX + the plain kind."""
KINDS = ("all_reduce", "all_gather", "reduce_scatter")
"""The plain kinds a tensor-parallel block issues through DTensor (cost.comm.TP_CALLS)."""


def _placements(kind: str) -> tuple[Any, Any]:
    """(from, to) of the redistribute that issues one `kind` (torch 2.13 _redistribute.py:
    Partial -> Replicate all-reduces, Shard -> Replicate all-gathers, Partial -> Shard
    reduce-scatters)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"all_reduce": (Partial(), Replicate()), "all_gather": (Shard(0), Replicate()),
            "reduce_scatter": (Partial(), Shard(0))}[kind]


def redistributes(buffers: dict[str, torch.Tensor], mesh: Any) -> dict[str, Callable[[], None]]:
    """{PREFIX + kind: one synchronous redistribute} over `mesh`, each DTensor built once from
    the kind's plain input buffer (collectives._buffers), so the call moves the same bytes as
    the plain call and allocates only what DTensor itself does."""
    from torch.distributed.tensor import DTensor

    calls: dict[str, Callable[[], None]] = {}
    for kind, buf in buffers.items():
        src, dst = _placements(kind)
        tensor = DTensor.from_local(buf, mesh, [src], run_check=False)

        def call(tensor: DTensor = tensor, dst: Any = dst) -> None:
            tensor.redistribute(mesh, [dst])  # async_op=False: waits for the collective

        calls[PREFIX + kind] = call
    return calls


def paired(plain: dict[str, Callable[[], None]], dtensor: dict[str, Callable[[], None]]
           ) -> dict[str, Callable[[], None]]:
    """The calls of one round, each redistribute right after its plain kind, so the pair meets
    the same moment of a shared host's load."""
    out: dict[str, Callable[[], None]] = {}
    for op, call in plain.items():
        out[op] = call
        if PREFIX + op in dtensor:
            out[PREFIX + op] = dtensor[PREFIX + op]
    return out


def excess_s(samples: dict[str, list[float]], key: str) -> float:
    """Median over rounds of a redistribute's seconds less the plain call's of the same round."""
    plain = samples[key.removeprefix(PREFIX)]
    return median(d - p for d, p in zip(samples[key], plain, strict=True))


def tp_collective_overhead_s(measured: dict[int, dict[str, list[list[float]]]]) -> float | None:
    """Seconds per DTensor collective (Efficiency.tp_collective_overhead_s): the median excess
    over the kinds and sizes the 2-rank job timed, never below 0; None where it timed none.
    The median, not the mean: a round where the plain call alone met the load puts one row
    ~1 ms below the others (three quick profiles of the 2-core host: rows -1.4 to 1.6 ms,
    means 0.02-1.21 ms, medians 0.44-1.20 ms)."""
    rows = [seconds for op, table in measured.get(2, {}).items() if op.startswith(PREFIX)
            for _, seconds in table]
    return max(median(rows), 0.0) if rows else None


def apply_tp_overhead(prof: dict[str, Any], measured: dict[int, dict[str, list[list[float]]]],
                      device: torch.device) -> None:
    """Write the measured excess into a profile's efficiency section: 0 on a GPU (a GPU hides
    host work behind kernels of real size, as profiler.dispatch.apply_dispatch does), the base
    profile's value where no 2-rank CPU group was timed."""
    if device.type != "cpu":
        prof["efficiency"]["tp_collective_overhead_s"] = 0.0
        return
    seconds = tp_collective_overhead_s(measured)
    if seconds is not None:
        prof["efficiency"]["tp_collective_overhead_s"] = float(seconds)
