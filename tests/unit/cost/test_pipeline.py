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
