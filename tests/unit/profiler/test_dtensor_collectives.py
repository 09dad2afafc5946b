"""profiler.dtensor_collectives: DTensor's excess per tensor-parallel collective, timed in
collectives.py's own 2-rank gloo job, and written into a profile's efficiency section."""

from __future__ import annotations

import pytest
import torch

from autoplan.profiler import collectives
from autoplan.profiler import dtensor_collectives as dtc


def test_the_excess_is_paired_by_round() -> None:
    """Each redistribute less the plain call of its own round: a round that was slow for both
    (a shared host's load) cancels, where the medians' difference would not."""
    samples = {"all_reduce": [1.0, 2.0, 3.0, 9.0, 9.5],
               "dtensor_all_reduce": [1.5, 2.1, 3.6, 9.6, 12.0]}
    assert dtc.excess_s(samples, "dtensor_all_reduce") == pytest.approx(0.6)


def test_each_redistribute_follows_its_plain_kind() -> None:
    plain = {op: (lambda: None) for op in collectives.OPS}
    dtensor = {dtc.PREFIX + k: (lambda: None) for k in dtc.KINDS}
    assert list(dtc.paired(plain, dtensor)) == [
        "all_reduce", "dtensor_all_reduce", "all_gather", "dtensor_all_gather",
        "reduce_scatter", "dtensor_reduce_scatter", "all_to_all", "send_recv"]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_real_two_rank_gloo_job_times_every_kind() -> None:
    """collectives.measure_collectives over 2 forked gloo ranks (FileStore, a finite
    process-group timeout, OMP_NUM_THREADS=1): one size of SIZES, 3 rounds, a few seconds.
    Only the per-call excess is read, never a time: the host is shared."""
    size = dtc.SIZES[0]
    measured = collectives.measure_collectives(2, "cpu", True, sizes=[size], repeats=3)
    for kind in dtc.KINDS:
        rows = measured[dtc.PREFIX + kind]
        assert [r[0] for r in rows] == [float(size)]
        assert all(isinstance(r[1], float) for r in rows)
    seconds = dtc.tp_collective_overhead_s({2: measured})
    assert isinstance(seconds, float) and 0.0 <= seconds < 1.0
    # the profile's tables hold the plain kinds only
    assert set(collectives.collective_tables({2: measured})) == set(collectives.OPS)


def test_the_profile_gets_the_median_excess_or_keeps_its_base() -> None:
    measured = {2: {"all_reduce": [[16384.0, 1e-3]],
                    "dtensor_all_reduce": [[16384.0, 4e-4], [262144.0, 8e-4]],
                    "dtensor_all_gather": [[16384.0, -3e-3]]}}
    prof: dict = {"efficiency": {"tp_collective_overhead_s": 7e-4}}
    dtc.apply_tp_overhead(prof, measured, torch.device("cpu"))
    assert prof["efficiency"]["tp_collective_overhead_s"] == pytest.approx(4e-4)
    prof = {"efficiency": {"tp_collective_overhead_s": 7e-4}}
    dtc.apply_tp_overhead(prof, {4: measured[2]}, torch.device("cpu"))  # no 2-rank group
    assert prof["efficiency"]["tp_collective_overhead_s"] == 7e-4
    dtc.apply_tp_overhead(prof, measured, torch.device("meta"))  # a GPU's: hidden, 0
    assert prof["efficiency"]["tp_collective_overhead_s"] == 0.0
    all_negative = {2: {"dtensor_all_reduce": [[16384.0, -2e-4]]}}
    assert dtc.tp_collective_overhead_s(all_negative) == 0.0
