"""Run one plan for a few steps with `autoplan train` in a child process and watch it.

The child writes one JSON line per step (--metrics-file); the runner reads them as they come,
hands each step time to a callback (which may ask to stop: pruning), enforces a time limit (a
hang fails the trial, it does not stall the tune) and classifies failures (out of memory,
crash, timeout) with the child's last error line as the reason, and reads the host's load as
it starts and ends (as `autoplan train` records it). `stop_on_signals` turns
SIGTERM/SIGHUP into an exception, so a stopped tune kills its child (which runs in a session of
its own and would not get the signal) and releases its locks on the way out.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WARMUP_STEPS = 1
"""Steps left out of the measured step time (compilation, allocator warm-up, first collectives)."""


@dataclass
class TrialOutcome:
    status: str
    """complete | pruned | failed"""
    reason: str = ""
    step_times_s: list[float] = field(default_factory=list)
    peak_memory_bytes: float | None = None
    wall_s: float = 0.0
    host_load: dict[str, Any] | None = None
    """The host's CPUs and load averages before the child started and after it stopped
    (runtime/machine.host_load, the fields a train run record keeps under machine); None
    where the OS gives no load average."""

    @property
    def step_time_s(self) -> float | None:
        steady = self.step_times_s[WARMUP_STEPS:] or self.step_times_s
        return statistics.median(steady) if steady else None


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C (the running trial is recorded as
    interrupted and runs again on resume), through every `finally` that kills a child."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextmanager
def stop_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)
                    ) -> Iterator[None]:
    """While the block runs, the first of `signums` raises Stopped in the main thread (later
    ones are ignored while that unwinds); the previous handlers come back afterwards. Off the
    main thread, where Python cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = False

    def handler(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train_command(plan_path: Path, nproc: int, steps: int, metrics: Path) -> list[str]:
    return [sys.executable, "-m", "autoplan.commands", "train", str(plan_path),
            "--nproc", str(nproc), "--steps", str(steps), "--metrics-file", str(metrics),
            "--format", "json"]


def _classify(returncode: int, stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    text = stderr.lower()
    if "out of memory" in text or "outofmemoryerror" in text or returncode in (-9, 137):
        kind = "out of memory"
    else:
        kind = f"crashed (exit {returncode})"
    last = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
    return f"{kind}: {last[:300]}" if last else kind


def run_trial(
    plan_path: Path, nproc: int, steps: int, workdir: Path, timeout_s: float,
    on_step: Callable[[int, float], bool] | None = None, command: list[str] | None = None,
) -> TrialOutcome:
    """Run `autoplan train` on the plan; `on_step(step, seconds)` returning True prunes."""
    from autoplan.runtime.machine import host_load, load_average

    workdir.mkdir(parents=True, exist_ok=True)
    metrics = workdir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    stderr_path = workdir / "stderr.log"
    cmd = command or train_command(plan_path, nproc, steps, metrics)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.monotonic()
    outcome = TrialOutcome(status="complete")
    load_start = load_average()  # before the child's ranks add to it
    with open(stderr_path, "w", encoding="utf-8") as err, open(os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        lines_seen = 0
        try:
            while True:
                finished = proc.poll() is not None
                records, lines_seen = _new_records(metrics, lines_seen)
                for rec in records:
                    seen = len(outcome.step_times_s) + 1
                    outcome.step_times_s.append(float(rec["step_time_s"]))
                    if rec.get("peak_memory_bytes") is not None:
                        outcome.peak_memory_bytes = max(outcome.peak_memory_bytes or 0.0,
                                                        float(rec["peak_memory_bytes"]))
                    if on_step and on_step(int(rec.get("step", seen)), float(rec["step_time_s"])):
                        outcome.status, outcome.reason = "pruned", (
                            f"pruned after step {seen}: slower than the best so far")
                        _kill(proc)
                        break
                if outcome.status == "pruned" or finished:
                    break
                if time.monotonic() - start > timeout_s:
                    _kill(proc)
                    outcome.status = "failed"
                    outcome.reason = f"timed out after {timeout_s:.0f} s (a hang or far too slow)"
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                _kill(proc)
    outcome.wall_s = time.monotonic() - start
    load_end = load_average()  # the 1-minute average still holds the ranks just stopped
    if load_start is not None or load_end is not None:
        outcome.host_load = host_load(load_start, load_end)
    if outcome.status == "complete" and proc.returncode != 0:
        outcome.status = "failed"
        outcome.reason = _classify(proc.returncode, stderr_path.read_text(errors="replace"))
    elif outcome.status == "complete" and not outcome.step_times_s:
        outcome.status, outcome.reason = "failed", "finished without reporting a step"
    return outcome


def _new_records(path: Path, lines_seen: int) -> tuple[list[dict], int]:
    """Step records in the lines after the first `lines_seen`, and the new count of whole
    lines read (a last line still being written is left for the next look)."""
    if not path.exists():
        return [], lines_seen
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # only lines that ended with a newline
    out = []
    for line in lines[lines_seen:]:
        lines_seen += 1
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step_time_s" in rec:
            out.append(rec)
    return out, lines_seen


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child and every rank it started (they share its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
