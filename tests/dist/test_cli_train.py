"""Real `autoplan train --nproc 2` runs through torchrun: smoke and errors (interrupts and
faults: test_interrupts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def test_gpt3_vocab_under_tp4_runs_padded(tmp_path):
    """#14 item 20: the README's search winner has tp 4 and GPT-3's 50257-token vocabulary,
    which tp does not divide; the runtime pads it to 50688 rows (a multiple of 128*4, as the
    cost model prices it) and masks the padding out of the loss."""
    from autoplan.model_spec import ModelSpec

    spec = ModelSpec(name="gpt3-vocab-tiny", num_layers=2, hidden_size=64, num_heads=4,
                     vocab_size=50257, seq_len=32, tie_embeddings=True)
    plan = str(save_plan(make_plan(spec, tp=4, sp=True), tmp_path / "plan.yaml"))
    metrics = tmp_path / "m.jsonl"
    proc = _train(plan, "--steps", "2", "--metrics-file", str(metrics), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in _metrics(metrics)] == [1, 2]
