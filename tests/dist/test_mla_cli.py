"""The tiny-mla preset (multi-head latent attention) through the real command line on cpu-gloo:
`autoplan estimate` prices a tp 2 + sequence-parallel plan without a refusal, and (slow: two
torchrun ranks) `autoplan train` runs it and logs measured next to predicted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.cost import params
from autoplan.model_spec import PRESETS
from autoplan.plan_files import save_plan
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

PLAN = make_plan("tiny-mla", tp=2, sp=True, mbs=2, gbs=4)


def test_estimate_prices_the_mla_plan(tmp_path: Path, capsys) -> None:
    path = save_plan(PLAN, tmp_path / "plan.yaml")
    code = main(["estimate", "--model", "tiny-mla", "--cluster", "cpu-gloo", "--num-gpus", "2",
                 "--plan", str(path), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["feasible"] is True and data["reasons"] == [], data["reasons"]
    assert data["num_params"] == params.total_params(PRESETS["tiny-mla"])
    assert data["time"]["step"] > 0 and data["time"]["tp_comm"] > 0
    assert 0 < data["memory"]["params"] < 4 * data["num_params"]  # fp32, split over tp 2


@pytest.mark.slow
def test_train_runs_the_mla_plan(tmp_path: Path) -> None:
    path = save_plan(PLAN, tmp_path / "plan.yaml")
    metrics = tmp_path / "m.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", "from autoplan.commands import main; "
                           "raise SystemExit(main())", "train", str(path), "--steps", "2",
                           "--metrics-file", str(metrics), "--format", "json"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["measured"]["tokens_per_s"] > 0 and summary["predicted"]["step_time_s"] > 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert abs(rows[0]["loss"] - math.log(256)) < 0.5, rows[0]  # a fresh byte-vocabulary model
