"""Pipeline bubble and in-flight micro-batches per schedule."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.pipeline import bubble_fraction, in_flight_microbatches
from autoplan.plan_table import GPIPE, INTERLEAVED, ONE_F_ONE_B, ZERO_BUBBLE

A = np.array


def test_bubble_fractions_follow_narayanan_et_al() -> None:
    # (p-1)/m for 1F1B and GPipe; (p-1)/(v m) interleaved (Narayanan et al. 2021, 2.2).
    assert float(bubble_fraction(A(ONE_F_ONE_B), A(8), A(1), A(64))) == pytest.approx(7 / 64)
    assert float(bubble_fraction(A(GPIPE), A(8), A(1), A(64))) == pytest.approx(7 / 64)
    assert float(bubble_fraction(A(INTERLEAVED), A(8), A(4), A(64))) == pytest.approx(7 / 256)
    zb = float(bubble_fraction(A(ZERO_BUBBLE), A(8), A(1), A(64)))
    assert 0 < zb < 7 / 64
    assert float(bubble_fraction(A(ONE_F_ONE_B), A(1), A(1), A(64))) == 0


def test_in_flight_microbatches_per_schedule() -> None:
    assert float(in_flight_microbatches(A(GPIPE), A(4), A(1), A(32))) == 32
    assert float(in_flight_microbatches(A(ONE_F_ONE_B), A(4), A(1), A(32))) == 4
    assert float(in_flight_microbatches(A(ONE_F_ONE_B), A(4), A(1), A(2))) == 2
    # Korthikanti et al. 2022, 4.2.3: interleaving holds 1 + (p-1)/(p v) times 1F1B's.
    inter = float(in_flight_microbatches(A(INTERLEAVED), A(8), A(2), A(64)))
    assert inter == pytest.approx(8 * (1 + 7 / 16))
    assert float(in_flight_microbatches(A(GPIPE), A(1), A(1), A(32))) == 1


def test_the_last_rank_warms_up_fewer_chunks_than_the_first() -> None:
    """Interleaved 1F1B warms up (pp - rank - 1) * 2 + (vpp - 1) * pp chunk forwards before a
    rank's first backward (Megatron-Core get_pp_rank_microbatches): pp 4, vpp 5 holds 23
    chunks (4.6 layer sets) on rank 0 and 17 (3.4) on rank 3; 1F1B's last rank holds one
    micro-batch, GPipe's all of them."""
    from autoplan.cost.pipeline import in_flight_last_rank, in_flight_microbatches

    sched = np.array([INTERLEAVED, ONE_F_ONE_B, GPIPE])
    pp, vpp, m = np.array([4, 4, 4]), np.array([5, 1, 1]), np.array([32, 32, 32])
    assert in_flight_microbatches(sched[:1], pp[:1], vpp[:1], m[:1])[0] == pytest.approx(23 / 5)
    assert list(in_flight_last_rank(sched, pp, vpp, m)) == pytest.approx([17 / 5, 1.0, 32.0])
    # fewer micro-batches than that: all of them
    assert in_flight_last_rank(sched[:1], pp[:1], vpp[:1], np.array([2]))[0] == 2.0
