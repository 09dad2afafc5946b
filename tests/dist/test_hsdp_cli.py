"""`autoplan train` runs HSDP with a bf16 gradient reduce through torchrun, and refuses the
invalid combinations before launch with one line naming the field (exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from autoplan.plan_files import save_plan
from tests.dist.parity import make_plan
from tests.dist.test_cli_train import _metrics, _train

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_train_hsdp_with_bf16_reduce(tmp_path):
    plan = save_plan(make_plan(dp=4, dp_shard=2, zero=2, precision="bf16", grad_reduce="bf16"),
                     tmp_path / "plan.yaml")
    metrics = tmp_path / "m.jsonl"
    proc = _train(str(plan), "--steps", "2", "--metrics-file", str(metrics), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["steps"] == 2
    rows = _metrics(metrics)
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.parametrize(("changes", "field"), [
    (dict(dp=4, dp_shard=2, zero=2, grad_reduce="bf16"), "grad_reduce_dtype=bf16"),
    (dict(dp=4, dp_shard=2, zero=0), "parallel.dp_shard=2 needs zero_stage"),
])
def test_invalid_hsdp_or_reduce_plans_exit_2(tmp_path, changes, field):
    plan = save_plan(make_plan(**changes), tmp_path / "plan.yaml")
    proc = _train(str(plan), "--steps", "1", timeout=60)
    assert proc.returncode == 2 and field in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
