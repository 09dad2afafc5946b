"""Interrupt a real `autoplan train` (Ctrl-C, SIGTERM, kill -9 of one rank) and resume it; used by
tests/dist/test_interrupts.py and benchmarks/kill_resume.py.

What counts (#14's acceptance): no live process of the run afterwards, no `step-N.tmp/` left, a
metrics file with each step exactly once, and the same final loss as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

OUTER_TIMEOUT_S = 240.0
KINDS = ("sigint", "sigterm", "kill9")


def train_cmd(plan: str, steps: int, ckpt: Path, metrics: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autoplan.commands", "train", plan, "--steps", str(steps),
            "--checkpoint-dir", str(ckpt), "--metrics-file", str(metrics), "--format", "json",
            *extra]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1")


def metrics_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            out.append(-1)  # a torn line would be a failure too
    return out


def _ranks(marker: str) -> list[int]:
    """Live processes whose command line names `marker` (the run's own checkpoint dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def _rank_pid(marker: str, rank: int) -> int | None:
    for pid in _ranks(marker):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"autoplan.runtime.worker" in cmd and f"RANK={rank}".encode() in env:
            return pid
    return None


def reference_loss(plan: str, steps: int, workdir: Path) -> float:
    proc = subprocess.run(train_cmd(plan, steps, workdir / "ref-ck", workdir / "ref.jsonl"),
                          capture_output=True, text=True, timeout=OUTER_TIMEOUT_S, env=_env())
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return float(json.loads(proc.stdout)["final_loss"])


@dataclass
class Result:
    kind: str
    at_step: int
    delivered: bool = False
    codes: list[int] = field(default_factory=list)
    final_loss: float | None = None
    steps_seen: list[int] = field(default_factory=list)
    leftover_pids: list[int] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)
    stderr: str = ""

    def problems(self, steps: int, ref_loss: float) -> list[str]:
        out = []
        if not self.delivered:
            out.append("the run ended before the signal")
        if self.leftover_pids:
            out.append(f"live processes {self.leftover_pids}")
        if self.temporaries:
            out.append(f"temporary checkpoints {self.temporaries}")
        if self.steps_seen != list(range(1, steps + 1)):
            out.append(f"metrics steps {self.steps_seen}")
        if self.final_loss != ref_loss:
            out.append(f"final loss {self.final_loss} != {ref_loss}")
        return out


def interrupt_and_resume(plan: str, steps: int, workdir: Path, kind: str, at_step: int,
                         every: int = 2) -> Result:
    """Run, deliver `kind` once the metrics file reaches `at_step`, resume (kill9: torchrun
    restarts by itself under --max-restarts 1), and collect what #14 checks."""
    ckpt, metrics = workdir / "ck", workdir / "m.jsonl"
    res = Result(kind, at_step)
    extra = ["--checkpoint-every", str(every)]
    if kind == "kill9":
        extra += ["--max-restarts", "1"]
    proc = subprocess.Popen(train_cmd(plan, steps, ckpt, metrics, *extra), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None and not res.delivered:
        if len(metrics_steps(metrics)) >= at_step:
            if kind == "kill9":
                pid = _rank_pid(str(ckpt), 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    res.delivered = True
            else:
                proc.send_signal(signal.SIGINT if kind == "sigint" else signal.SIGTERM)
                res.delivered = True
        time.sleep(0.01)
    out, err = proc.communicate(timeout=OUTER_TIMEOUT_S)
    res.codes.append(proc.returncode)
    res.stderr = err
    if kind != "kill9" and proc.returncode in (130, 143):
        resumed = subprocess.run(train_cmd(plan, steps, ckpt, metrics, "--resume", *extra),
                                 capture_output=True, text=True, timeout=OUTER_TIMEOUT_S,
                                 env=_env())
        res.codes.append(resumed.returncode)
        res.stderr += resumed.stderr
        out = resumed.stdout
    if res.codes[-1] == 0:
        res.final_loss = float(json.loads(out)["final_loss"])
    res.steps_seen = metrics_steps(metrics)
    time.sleep(0.2)  # ranks of a killed torchrun could linger a moment: count them if so
    res.leftover_pids = _ranks(str(ckpt))
    res.temporaries = sorted(p.name for p in ckpt.glob("*.tmp")) if ckpt.exists() else []
    return res
