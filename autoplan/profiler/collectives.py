"""Collective and point-to-point times over message sizes and group sizes.

Each group size is one short job of forked CPU processes (gloo) or spawned GPU processes
(NCCL), rendezvous through a FileStore, with a finite timeout on the process group. Rank 0
writes the medians (the slowest rank's) as JSON; nothing is pickled to or from disk.

On CPU each collective is timed as training meets it: a burst of (about a millisecond of
arithmetic, one call) on every rank, less the same arithmetic timed alone. Ranks that share
cores with compute arrive apart and gloo's transport threads compete with the arithmetic for
a core, so a call costs several times what it costs right after a barrier (measured here on
2 ranks: 1.2-1.7 ms against 0.3 ms for a 1 KiB all-reduce).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autoplan.errors import RuntimeLaunchError
from autoplan.profiler import dtensor_collectives as dtc

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
TIMEOUT = timedelta(seconds=120)


def message_sizes(device_type: str, quick: bool) -> list[int]:
    top = 256 * 2**20 if device_type == "cuda" else 64 * 2**20
    if quick:
        top = min(top, 16 * 2**20)
    sizes, size = [], 1024
    while size <= top:
        sizes.append(size)
        size *= 4 if quick else 2 if device_type == "cuda" else 4
    return sizes


INTERLEAVE_S = 1e-3
"""Arithmetic each CPU rank does before each call (see the module docstring)."""
BURST = 4
"""Calls per CPU sample: the time of BURST x (arithmetic, call) less BURST x arithmetic."""


def _arithmetic(seconds: float):
    """A function that keeps this rank's core busy with matmuls for about `seconds`."""
    import time

    a = torch.randn(128, 128)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    per = (time.perf_counter() - t0) / 10
    count = max(1, round(seconds / max(per, 1e-7)))

    def run() -> None:
        for _ in range(count):
            a @ a

    return run


def measured_ops(world: int) -> tuple[str, ...]:
    """The kinds measured over `world` ranks: send_recv only over 2, the one group the cost
    model reads it for (a pipeline send is one pair of ranks, cost.comm.p2p_time_s); over more
    ranks it is the same pair with the others idle."""
    return OPS if world == 2 else tuple(op for op in OPS if op != "send_recv")


def _buffers(op: str, nbytes: int, world: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input, output) of one call, allocated once per kind and size, outside the timed calls.
    Zeros: an all-reduce in place keeps them zeros however often it runs (ones grow to inf)."""
    numel = max(world, nbytes // 4 // world * world)
    buf = torch.zeros(numel, device=device)
    out = {"all_gather": numel * world, "reduce_scatter": numel // world,
           "all_to_all": numel}.get(op)
    return buf, None if out is None else torch.empty(out, device=device)


def _call(op: str, buf: torch.Tensor, out: torch.Tensor | None, rank: int) -> None:
    """One call of `op` on buffers from _buffers: what is timed."""
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, buf)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    elif op == "all_to_all":
        dist.all_to_all_single(out, buf)
    elif op == "send_recv":
        if rank == 0:
            dist.send(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)


def _sample(call, device: torch.device, timed_alone: bool, work) -> float:
    """Seconds of one call: alone after a barrier (NCCL, and a pipeline's send on any backend:
    torch.distributed.pipelining posts its sends and receives ahead of need), else on CPU as
    training meets it (the module docstring): BURST x (arithmetic, call) less the arithmetic."""
    import time

    dist.barrier()
    if timed_alone:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(BURST):
        work()
    alone = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(BURST):
        work()
        call()
    burst = (time.perf_counter() - t0 - alone) / BURST
    dist.barrier()
    t0 = time.perf_counter()
    call()
    # never below the call alone: where ranks do not share cores, the burst's difference is
    # within the arithmetic's noise
    return max(burst, time.perf_counter() - t0)


def _dtensor_mesh(world: int) -> Any:
    """The job's default group as a 1-D device mesh, for the DTensor excess
    (profiler.dtensor_collectives), over 2 CPU ranks only: the group size tensor-parallel
    plans of a 2-core host run; None for any other."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,)) if world == 2 else None


def _worker(rank: int, world: int, store_path: str, out_path: str, backend: str,
            sizes: list[int], repeats: int) -> None:
    import warnings

    # all_gather_into_tensor / reduce_scatter_tensor: deprecated after 2.11 in favour of
    # *_single, which 2.11 (our oldest supported GPU stack) may lack; keep the portable names.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    ops = measured_ops(world)
    results: dict[str, list[list[float]]] = {op: [] for op in ops}
    work = _arithmetic(INTERLEAVE_S)
    mesh = _dtensor_mesh(world) if backend == "gloo" else None
    try:
        for nbytes in sizes:
            buffers = {op: _buffers(op, nbytes, world, device) for op in ops}
            calls = {op: partial(_call, op, *buffers[op], rank) for op in ops}
            if mesh is not None and nbytes in dtc.SIZES:  # each right after its plain kind
                calls = dtc.paired(calls, dtc.redistributes(
                    {k: buffers[k][0] for k in dtc.KINDS}, mesh))
            for call in calls.values():
                call()  # warm-up (and connection set-up)
            samples: dict[str, list[float]] = {op: [] for op in calls}
            # every kind once per round, so a load that comes and goes on a shared host
            # meets each kind alike (timed kind after kind, a 2-rank CPU profile read a
            # 64 KiB reduce-scatter at 1.1 ms beside a 3.1 ms all-reduce, which gloo runs
            # it as: tests/unit/profiler/test_collectives.py)
            for _ in range(repeats):
                for op, call in calls.items():
                    samples[op].append(_sample(call, device, backend == "nccl"
                                               or op == "send_recv", work))
            for op in calls:  # a kind's median; a redistribute's, its excess over the kind
                got = sorted(samples[op])
                median = torch.tensor([dtc.excess_s(samples, op) if op.startswith(dtc.PREFIX)
                                       else got[len(got) // 2]], dtype=torch.float64)
                if backend == "nccl":
                    median = median.to(device)
                dist.all_reduce(median, op=dist.ReduceOp.MAX)
                results.setdefault(op, []).append([float(nbytes), float(median.item())])
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def gloo_reduce_scatter_floor(rows: dict[str, list[list[float]]]
                              ) -> dict[str, list[list[float]]]:
    """`rows` with each reduce-scatter time raised to the all-reduce's at its size. gloo runs
    reduce_scatter_tensor as an all-reduce of the whole input and a copy of this rank's share
    (torch 2.13: the call's profiler event is gloo:all_reduce, held by
    tests/unit/profiler/test_collectives.py), so a reduce-scatter timed below the all-reduce
    beside it is noise: a 2-rank CPU profile read 1.1 ms for a 64 KiB reduce-scatter beside a
    3.1 ms all-reduce, where a tp 2 step spends about as long in either."""
    ar = {nbytes: seconds for nbytes, seconds in rows.get("all_reduce", [])}
    if "reduce_scatter" not in rows:
        return rows
    floored = [[nbytes, max(seconds, ar.get(nbytes, 0.0))] for nbytes, seconds in
               rows["reduce_scatter"]]
    return {**rows, "reduce_scatter": floored}


def full_message_bytes(op: str, nbytes: float, group: int) -> float:
    """The benchmark's per-rank buffer as the cost model's message size: an all-gather's is
    its output (autoplan.cost.comm prices the full message)."""
    return nbytes * group if op == "all_gather" else nbytes


def monotone(seconds: list[float]) -> list[float]:
    """Each time replaced by the least of it and every larger size's, so the table never falls
    with size: a slow small-message sample (a rank that lost its core) would otherwise price
    every small call of a run."""
    out, best = [], float("inf")
    for t in reversed(seconds):
        best = min(best, t)
        out.append(best)
    return out[::-1]


def collective_tables(measured: dict[int, dict[str, list[list[float]]]]) -> dict[str, Any]:
    """{kind: {group: {x: bytes, y: seconds}}}: the profile's `collectives` section
    (autoplan.hardware.CollectiveTimes)."""
    tables: dict[str, Any] = {}
    for group, ops in sorted(measured.items()):
        for op, rows in ops.items():
            if op.startswith(dtc.PREFIX):  # no table: Efficiency.tp_collective_overhead_s
                continue
            rows = sorted(rows)
            tables.setdefault(op, {})[int(group)] = {
                "x": [full_message_bytes(op, r[0], int(group)) for r in rows],
                "y": monotone([r[1] for r in rows]),
            }
    return tables


def measure_collectives(group_size: int, device_type: str, quick: bool,
                        sizes: list[int] | None = None, repeats: int | None = None
                        ) -> dict[str, list[list[float]]]:
    """{op: [[bytes, seconds], ...]} for one group of `group_size` ranks; over 2 CPU ranks also
    {dtensor_collectives.PREFIX + kind: [[bytes, DTensor's excess seconds], ...]} at its SIZES.
    `sizes` and `repeats` replace message_sizes' and the default counts (a short test)."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    sizes = message_sizes(device_type, quick) if sizes is None else sizes
    if repeats is None:
        repeats = 7 if quick else 11  # odd: the median is a sample
    with tempfile.TemporaryDirectory(prefix="autoplan-profile-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        env = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        ctx = None
        try:
            ctx = mp.start_processes(
                _worker, args=(group_size, store, out, backend, sizes, repeats),
                nprocs=group_size, join=False,
                start_method="spawn" if backend == "nccl" else "fork")
            deadline = TIMEOUT.total_seconds() * 4
            import time

            start = time.monotonic()
            while not ctx.join(timeout=5):
                if time.monotonic() - start > deadline:
                    raise RuntimeLaunchError(
                        f"collective benchmark with {group_size} ranks did not finish in "
                        f"{deadline:.0f} s")
        except mp.ProcessRaisedException as err:
            raise RuntimeLaunchError(f"collective benchmark failed: {err}") from None
        finally:  # a timeout, a failed rank, Ctrl-C or SIGTERM (autoplan profile raises it)
            if ctx is not None:
                stop_workers(ctx.processes)
            if env is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env
        measured = json.loads(Path(out).read_text())
        return gloo_reduce_scatter_floor(measured) if backend == "gloo" else measured


def stop_workers(processes: list[Any]) -> None:
    """Kill every benchmark rank still running and reap it, so none outlives the profile run
    (they would hold a core and the temporary folder's FileStore)."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=10)
