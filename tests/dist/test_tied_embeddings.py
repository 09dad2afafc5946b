"""Tied embeddings across layouts: checkpoints name the tied weight once (embed.tok.weight), so a
pp=1 checkpoint continues under pp=2 (two copies) and a pp=2 checkpoint under pp=1; the pp=2
side runs with optimizer-only offload, so its host optimizer state saves and loads too."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import RTOL, make_plan
from tests.dist.resume_tasks import train_with_checkpoints

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _params(results: list[dict]) -> dict:
    out: dict = {}
    for r in results:
        out.update(r["params"])
    return out


def test_tied_checkpoints_move_between_pp1_and_pp2(pool, tmp_path):
    one = make_plan(model="tiny-tied")
    two = make_plan(model="tiny-tied", pp=2, offload=True, offload_params=False)
    straight = pool.run(train_with_checkpoints, 1, one, str(tmp_path / "a"), False, 12, (6,))[0]
    # pp=1 checkpoint -> pp=2 (the last stage's copy loads from embed.tok.weight)
    got = pool.run(train_with_checkpoints, 2, two, str(tmp_path / "a"), True, 12, ())
    for step in range(7, 13):
        assert got[0]["losses"][step] == pytest.approx(straight["losses"][step], rel=RTOL)
    params = _params(got)
    assert np.array_equal(params["embed.tok.weight"], params["output.weight"])  # copies agree
    # pp=2 checkpoint (host optimizer state, two copies saved as one) -> pp=1
    pool.run(train_with_checkpoints, 2, two, str(tmp_path / "b"), False, 6, (6,))
    back = pool.run(train_with_checkpoints, 1, one, str(tmp_path / "b"), True, 12, ())[0]
    for step in range(7, 13):
        assert back["losses"][step] == pytest.approx(straight["losses"][step], rel=RTOL)
    for name, p in straight["params"].items():
        q = back["params"][name]
        assert np.linalg.norm(q - p) <= RTOL * np.linalg.norm(p) + 2e-7 * np.sqrt(p.size), name
