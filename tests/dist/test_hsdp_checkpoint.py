"""HSDP checkpoints reshard: a checkpoint saved under dp 4 in shard groups of 2 (dp_shard 2,
ZeRO-3) continues under full sharding over all 4 ranks (DCP reshards parameters and optimizer
state by FQN) within parity tolerance of the uninterrupted HSDP run."""

from __future__ import annotations

import pytest

from tests.dist.parity import RTOL, SHIFT_INVARIANT, make_plan, rel_err
from tests.dist.resume_tasks import train_with_checkpoints

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_hsdp_checkpoint_resumes_under_another_shard_group(pool, tmp_path):
    hsdp = make_plan(dp=4, dp_shard=2, zero=3)
    straight = pool.run(train_with_checkpoints, 4, hsdp, str(tmp_path), False, 10, (5,))
    assert (tmp_path / "step-00000005" / "meta.json").is_file()
    full = make_plan(dp=4, zero=3)  # dp_shard null: one shard group of 4
    resumed = pool.run(train_with_checkpoints, 4, full, str(tmp_path), True, 10, ())
    assert [r["resumed"] for r in resumed] == [5] * 4
    want, got = straight[0]["losses"], resumed[0]["losses"]
    assert sorted(got) == list(range(6, 11))
    for step in range(6, 11):
        assert got[step] == pytest.approx(want[step], rel=RTOL), step
    for name, p in straight[0]["params"].items():  # rank 0 gathers every full parameter
        if not name.endswith(SHIFT_INVARIANT):  # round-off only (tests/dist/parity.py)
            assert rel_err(resumed[0]["params"][name], p) <= RTOL, name
