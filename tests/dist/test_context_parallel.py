"""CONTEXT PARALLEL checkpoints: DCP state saved under cp = 2 loads under cp = 1 and back.

Parameter FQNs do not depend on cp, and under ZeRO-3 the parameters and Adam states are sharded
over dp x cp, so the round trip reshards them. (cp parity rows live in test_parity.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import RTOL, make_plan
from tests.dist.resume_tasks import train_with_checkpoints
from tests.dist.test_parity import ADAM_PARAM_ATOL

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _run(pool, plan, ckpt_dir, resume, last_step, save_at):
    results = pool.run(train_with_checkpoints, plan.world_size, plan, ckpt_dir, resume,
                       last_step, save_at)
    params = {}
    for r in results:
        params.update(r["params"])
    return results[0]["losses"], params


def test_checkpoint_moves_between_cp2_and_cp1(pool, tmp_path):
    one, cp2 = make_plan("tiny-llama"), make_plan("tiny-llama", cp=2, zero=3)
    ckpt = str(tmp_path / "ckpt")
    straight, straight_params = _run(pool, one, str(tmp_path / "straight"), False, 8, ())
    losses = {}
    for plan, resume, last in ((cp2, False, 3), (one, True, 6), (cp2, True, 8)):
        got, params = _run(pool, plan, ckpt, resume, last, (last,))
        assert set(got) == set(range(min(got), last + 1)) and min(got) == len(losses) + 1
        losses.update(got)
    for step, loss in straight.items():
        assert losses[step] == pytest.approx(loss, rel=RTOL), step
    for name, p in straight_params.items():
        err = np.linalg.norm(params[name] - p)
        assert err <= RTOL * np.linalg.norm(p) + ADAM_PARAM_ATOL * np.sqrt(p.size), name
