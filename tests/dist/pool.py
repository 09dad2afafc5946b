"""Forked worker processes that run one multi-rank task at a time.

Forking from a parent that already imported torch costs ~0.1-0.3 s instead of ~7-15 s per
torchrun (measured on the 2-core test machine: every torchrun rank imports torch afresh). Each
task gets freshly forked ranks, a FileStore rendezvous and a gloo process group with a finite
timeout; a task past its deadline is killed.

Why not keep the same workers for every task: in torch 2.13, a process that ran a 3-D
(tp x pp) task and destroyed its process group later failed to resolve a DeviceMesh group
("Could not resolve the process group registered under the name 27") in the next task, so
process-global state does not reliably survive init/destroy cycles. The likely culprit is
DTensor's process-wide caches (sharding propagation, redistribute plans) keyed by meshes that
compare equal across tasks (same ranks and layout) while naming the old task's process groups.
A fork per task costs a fraction of a second and isolates tasks completely.

Modules, unlike process groups, are safe to share: the pool imports the runtime once, in the
parent (`PRELOAD`), so that a forked rank does not import it again. Measured on the 2-core test
machine: importing the runtime in each of 8 fresh ranks took 4.5 s of an 8-rank task's 6.5 s
(dp 8, ZeRO-3, four steps), and 0.0 s once the parent had imported it (the task: 2.0 s).
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

PG_TIMEOUT_S = 45.0
PRELOAD = ("autoplan.runtime.parallelize", "autoplan.runtime.trainer", "autoplan.runtime.data",
           "autoplan.runtime.checkpoint", "autoplan.runtime.optim")
"""Imported in the parent before any fork: the modules every rank's task needs (they pull in
torch.distributed's DTensor, FSDP2, pipelining and checkpoint packages)."""


def _stack_path(store_path: str, rank: int) -> str:
    return f"{store_path}.rank{rank}.stack"


def _task_main(rank: int, fn: Callable[..., Any], world_size: int, store_path: str,
               args: tuple[Any, ...], results: Any, dump_after_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # a rank still running shortly before the parent's deadline writes every thread's stack
    # where the parent can put it in the TimeoutError (a hang is otherwise a bare "timed out")
    stack_file = open(_stack_path(store_path, rank), "w")  # noqa: SIM115 (lives until _exit)
    faulthandler.dump_traceback_later(dump_after_s, file=stack_file)
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        out: Any = ("ok", fn(rank, world_size, *args))
    except BaseException:  # report everything; the parent decides
        out = ("error", traceback.format_exc())
    _leave_together(dist)
    faulthandler.cancel_dump_traceback_later()
    results.put((rank, out))
    results.close()
    results.join_thread()
    os._exit(0)  # skip interpreter teardown (it can hang after gloo; see the notes)


def _leave_together(dist: Any) -> None:
    """Wait for every rank before any exits. A rank that is done and exits closes its gloo
    sockets, and a peer still finishing the same step (a pair handshake of a group being
    created, a message not yet read) then fails with "Connection closed by peer": seen in a
    full run on 2 cores, 1 in ~4,000 tasks (test_group_timeouts, building the expert mesh).
    Best effort: a rank whose task failed may leave the others in another collective, which
    then ends at the group's timeout as it would have."""
    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    except BaseException:  # noqa: BLE001 (the task's own result is what the parent reports)
        pass


class WorkerPool:
    """Runs fn(rank, world_size, *args) on up to `size` freshly forked ranks per task."""

    def __init__(self, size: int = 8, preload: tuple[str, ...] = PRELOAD) -> None:
        self.size = size
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        for module in preload:
            importlib.import_module(module)

    def close(self) -> None:
        pass

    def run(self, fn: Callable[..., Any], world_size: int, *args: Any,
            timeout_s: float = 180.0) -> list[Any]:
        """Results by rank. Raises RuntimeError with the ranks' tracebacks, or TimeoutError."""
        import torch.multiprocessing as tmp

        assert world_size <= self.size
        fd, store_path = tempfile.mkstemp(prefix="autoplan-store-")
        os.close(fd)
        os.unlink(store_path)
        results = mp.get_context("fork").Queue()
        ctx = tmp.start_processes(
            _task_main, args=(fn, world_size, store_path, args, results, max(1.0, timeout_s - 10)),
            nprocs=world_size, join=False, start_method="fork",
        )
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < world_size:
                try:
                    rank, res = results.get(timeout=max(0.1, deadline - time.monotonic()))
                    out[rank] = res
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(_timeout_report(
                            timeout_s, world_size, store_path, out)) from None
        finally:
            for p in ctx.processes:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
            for path in [store_path] + [_stack_path(store_path, r) for r in range(world_size)]:
                if os.path.exists(path):
                    os.unlink(path)
        errors = [f"rank {r}:\n{res[1]}" for r, res in sorted(out.items()) if res[0] != "ok"]
        if errors:
            raise RuntimeError("\n".join(errors))
        return [out[r][1] for r in range(world_size)]


def _timeout_report(timeout_s: float, world_size: int, store_path: str,
                    out: dict[int, Any]) -> str:
    """What each rank was doing: the reports of the ranks that finished, the stacks of the rest."""
    lines = [f"task timed out after {timeout_s}s; ranks done: {sorted(out)}"]
    for rank, (status, res) in sorted(out.items()):
        if status != "ok":
            lines.append(f"rank {rank} reported:\n{res}")
    for rank in range(world_size):
        if rank in out:
            continue
        try:
            with open(_stack_path(store_path, rank)) as f:
                stack = f.read().strip() or "(no stack written)"
        except OSError:
            stack = "(no stack file)"
        lines.append(f"rank {rank} still running:\n{stack}")
    return "\n".join(lines)
