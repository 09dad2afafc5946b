"""Real `autoplan train --nproc 2` runs through torchrun: smoke, errors, resume, and FAULTS
(kill -9 of one rank under --max-restarts 1 resumes from the last whole checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoplan.plan import save_plan
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

OUTER_TIMEOUT_S = 240


def _train(*args: str, timeout: float = OUTER_TIMEOUT_S, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "autoplan.runtime.cli", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def _plan(tmp_path: Path, name: str = "plan", **kw) -> str:
    return str(save_plan(make_plan(**kw), tmp_path / f"{name}.yaml", overwrite=True))


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_train_dp2_json_with_text_data_and_metrics(tmp_path):
    import pydoc_data.topics

    data = tmp_path / "topics.txt"
    data.write_text("\n".join(pydoc_data.topics.topics.values()), encoding="utf-8")
    plan = _plan(tmp_path, dp=2, zero=3)
    metrics = tmp_path / "m.jsonl"
    proc = _train(plan, "--nproc", "2", "--steps", "4", "--data", str(data), "--metrics-file",
                  str(metrics), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 4 and summary["measured"]["tokens_per_s"] > 0
    rows = _metrics(metrics)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert set(rows[0]) == {"step", "loss", "step_time_s", "tokens_per_s", "peak_memory_bytes",
                            "grad_norm", "loss_scale", "skipped"}
    assert rows[0]["loss_scale"] is None and rows[0]["skipped"] is False  # fp32: no scaling


def test_bad_plans_fail_before_launch_with_exit_2(tmp_path):
    plan = _plan(tmp_path, dp=2)
    proc = _train(plan, "--nproc", "3", "--steps", "1", timeout=60)
    assert proc.returncode == 2 and "world size 3" in proc.stderr
    bad = _plan(tmp_path, "bad", tp=8)
    proc = _train(bad, "--steps", "1", timeout=60)
    assert proc.returncode == 2 and "num_heads" in proc.stderr
    proc = _train(plan, "--backend", "nccl", "--steps", "1", timeout=60)
    assert proc.returncode == 2 and "CUDA" in proc.stderr


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rank_pid(root: int, rank: int) -> int | None:
    for pid in _descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"autoplan.runtime.worker" in cmd and f"RANK={rank}".encode() in env:
            return pid
    return None


def test_kill_9_one_rank_restarts_from_checkpoint(tmp_path):
    plan = _plan(tmp_path, dp=2, zero=2)
    steps = "40"
    ref = _train(plan, "--steps", steps, "--format", "json")
    assert ref.returncode == 0, ref.stderr[-3000:]
    metrics = tmp_path / "m.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "autoplan.runtime.cli", "train", plan, "--steps", steps,
           "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "5",
           "--max-restarts", "1", "--metrics-file", str(metrics), "--format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    killed = False
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None and not killed:
        if metrics.exists() and any(r["step"] >= 12 for r in _metrics(metrics)):
            pid = _rank_pid(proc.pid, 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = True
        time.sleep(0.02)
    out, err = proc.communicate(timeout=OUTER_TIMEOUT_S)
    (tmp_path / "stderr.txt").write_text(err)
    assert killed, "the run ended before a rank could be killed"
    assert proc.returncode == 0, err[-3000:]
    steps_seen = [r["step"] for r in _metrics(metrics)]
    restart_at = next(b for a, b in zip(steps_seen, steps_seen[1:], strict=False) if b <= a)
    assert (restart_at - 1) % 5 == 0, steps_seen  # resumed right after a whole checkpoint
    assert steps_seen[-1] == 40
    assert json.loads(out)["final_loss"] == json.loads(ref.stdout)["final_loss"]


def test_sigterm_checkpoints_and_resume_finishes_identically(tmp_path):
    plan = _plan(tmp_path, dp=2, zero=3)
    ref = _train(plan, "--steps", "30", "--format", "json")
    assert ref.returncode == 0, ref.stderr[-3000:]
    metrics, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "autoplan.runtime.cli", "train", plan, "--steps", "30",
           "--checkpoint-dir", str(ck), "--metrics-file", str(metrics), "--format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and any(r["step"] >= 5 for r in _metrics(metrics)):
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=OUTER_TIMEOUT_S)
    assert proc.returncode == 1 and "SIGTERM" in err, err[-3000:]
    saved = sorted(p.name for p in ck.iterdir())
    assert saved and all(not name.endswith(".tmp") for name in saved), saved
    last = max(r["step"] for r in _metrics(metrics))
    assert saved[-1] == f"step-{last:08d}"  # the step it was in when the signal came
    resumed = _train(plan, "--steps", "30", "--checkpoint-dir", str(ck), "--resume",
                     "--format", "json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["final_loss"] == json.loads(ref.stdout)["final_loss"]
