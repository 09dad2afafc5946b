"""RESUME: save at step 20, stop, resume to 40 == 40 uninterrupted steps (bitwise, same plan);
the step-20 checkpoint loaded under other plans continues within parity tolerance (tp 4 pads
the vocabulary to 512 rows instead of 256: the rows are re-padded on load); a damaged newest
checkpoint falls back to the one before it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import RTOL, make_plan
from tests.dist.resume_tasks import train_with_checkpoints

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def _merge(results):
    params = {}
    for r in results:
        params.update(r["params"])
    return results[0]["losses"], params


def test_resume_is_bitwise_and_reshards(pool, tmp_path):
    plan = make_plan(dp=2, zero=2)
    straight, straight_params = _merge(pool.run(
        train_with_checkpoints, 2, plan, str(tmp_path / "a"), False, 40, ()))
    first, _ = _merge(pool.run(
        train_with_checkpoints, 2, plan, str(tmp_path / "b"), False, 20, (20,)))
    assert (tmp_path / "b" / "step-00000020" / "meta.json").is_file()
    assert not list((tmp_path / "b").glob("*.tmp"))
    second, second_params = _merge(pool.run(
        train_with_checkpoints, 2, plan, str(tmp_path / "b"), True, 40, ()))
    assert first == {s: straight[s] for s in range(1, 21)}
    assert second == {s: straight[s] for s in range(21, 41)}  # bitwise
    for name, p in straight_params.items():
        assert np.array_equal(second_params[name], p), name

    # the same checkpoint under other layouts: TP+SP, PP, one process, ZeRO-3 over 4 ranks
    for other in (make_plan(tp=2, sp=True), make_plan(pp=2, schedule="gpipe"), make_plan(),
                  make_plan(dp=2, tp=2, zero=3), make_plan(tp=4)):
        got, _ = _merge(pool.run(train_with_checkpoints, other.world_size, other,
                                 str(tmp_path / "b"), True, 30, ()))
        for step in range(21, 31):
            assert got[step] == pytest.approx(straight[step], rel=RTOL), (other.parallel, step)


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(pool, tmp_path):
    plan = make_plan(dp=2, zero=1)
    straight, _ = _merge(pool.run(
        train_with_checkpoints, 2, plan, str(tmp_path / "a"), False, 12, ()))
    pool.run(train_with_checkpoints, 2, plan, str(tmp_path / "b"), False, 8, (4, 8))
    data = sorted((tmp_path / "b" / "step-00000008").glob("*.distcp"))[-1]
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a save cut short
    results = pool.run(train_with_checkpoints, 2, plan, str(tmp_path / "b"), True, 12, ())
    assert [r["resumed"] for r in results] == [4, 4]
    got, _ = _merge(results)
    assert got == {s: straight[s] for s in range(5, 13)}  # bitwise
