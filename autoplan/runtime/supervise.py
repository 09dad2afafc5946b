"""Run torchrun under the CLI and stop it cleanly on Ctrl-C or SIGTERM.

torchrun runs in its own session, so a terminal's Ctrl-C reaches only the CLI (torch's elastic
agent would otherwise kill the ranks mid-step, and they start their own sessions too, so they
never see it). The first SIGINT or SIGTERM creates the stop file the ranks look for after every
step: they agree to stop through the step's loss all-reduce, checkpoint, and exit 0. A second
signal, or ranks that have not finished within the grace period, kill torchrun and every
process under it. The ranks also stop when the CLI itself is gone (worker._StopFlag).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    returncode: int
    signal: int | None = None
    """The first SIGINT/SIGTERM the CLI received, if any."""
    killed: bool = False
    """torchrun and its ranks had to be killed (a second signal, or past the grace period)."""


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every process under it (ranks run in sessions of their own)."""
    pids = descendants(proc.pid)
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_supervised(cmd: list[str], env: dict[str, str], stop_file: str,
                   grace_s: float) -> Outcome:
    """Run `cmd` (torchrun); worker stdout goes to our stderr (our stdout carries only the
    summary with --format json)."""
    out = Outcome(returncode=0)
    asked_at = {"t": 0.0}

    def on_signal(signum, frame) -> None:
        if out.signal is None:
            out.signal = signum
            asked_at["t"] = time.monotonic()
            Path(stop_file).touch()
            sys.stderr.write(f"autoplan train: {signal.Signals(signum).name}: stopping after "
                             "the current step (again to stop now)\n")
        else:
            out.killed = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = subprocess.Popen(cmd, stdout=sys.stderr, env=env, start_new_session=True)
    try:
        while True:
            try:
                out.returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            late = out.signal is not None and time.monotonic() - asked_at["t"] > grace_s
            if out.killed or late:
                out.killed = True
                kill_tree(proc)
                out.returncode = proc.returncode
                break
    finally:
        if proc.poll() is None:  # an exception in this loop: leave nothing running
            kill_tree(proc)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return out
