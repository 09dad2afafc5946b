"""NCCL's NVLS (NVLink SHARP) all-reduce inside an H100/H200 node (Efficiency.nvls_all_reduce):
read off published nccl-tests tables, taken where it beats the ring, all-reduce inside a node only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autoplan.cost import comm
from autoplan.hardware import load_profile
from autoplan.yaml_io import read_yaml

DATA = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "nccl-published.yaml"
H100 = load_profile("h100-sxm-80gb")
RING_ONLY = replace(H100, efficiency=replace(H100.efficiency, nvls_all_reduce=None))
MiB = float(1 << 20)


def _all_reduce(profile, nbytes: float, n: int, inside: bool = True,
                kind: str = comm.ALL_REDUCE) -> float:
    return float(comm.collective_time_s(kind, np.array([nbytes]), np.array([float(n)]),
                                        np.array([inside]), profile)[0])


@pytest.mark.parametrize("table", read_yaml(DATA, "--data")["sets"], ids=lambda t: t["id"])
def test_each_profile_files_its_published_nvls_table_as_algorithm_bandwidth(table) -> None:
    """y = busbw x n / (2 (n - 1)) over the link, at the table's sizes, to 3 figures: the
    profile's curve is the nccl-tests table, not a fit."""
    profile = load_profile(table["profile"])
    curve = getattr(profile.efficiency, table["field"])
    n = table["ranks"]
    assert list(curve.x) == [float(size) for size, _ in table["rows"]]
    for (size, busbw), y in zip(table["rows"], curve.y, strict=True):
        assert y == pytest.approx(busbw * 1e9 * n / (2 * (n - 1)) / profile.intra_node.bytes_per_s,
                                  rel=5e-3), size


def test_an_eight_gpu_all_reduce_takes_nvls_where_it_is_faster_and_nothing_else_moves() -> None:
    nvls = 256 * MiB / (H100.intra_node.bytes_per_s * H100.efficiency.nvls_all_reduce(256 * MiB))
    assert _all_reduce(H100, 256 * MiB, 8) == pytest.approx(nvls)
    assert _all_reduce(RING_ONLY, 256 * MiB, 8) > 1.2 * nvls  # the ring as priced
    for kind in (comm.ALL_GATHER, comm.REDUCE_SCATTER):  # NVLS offloads all-reduce only
        assert _all_reduce(H100, 256 * MiB, 8, kind=kind) == _all_reduce(
            RING_ONLY, 256 * MiB, 8, kind=kind)
    # across nodes the ring or tree runs as before (the NIC leg, not NVLink, bounds it)
    assert _all_reduce(H100, 256 * MiB, 64, inside=False) == _all_reduce(
        RING_ONLY, 256 * MiB, 64, inside=False)
    # an A100 node has no NVLS (its NVSwitch does not reduce): its profile files none
    assert load_profile("a100-sxm4-80gb").efficiency.nvls_all_reduce is None


def test_nvls_shares_scale_with_the_group_and_the_ring_wins_two_ranks() -> None:
    """Each GPU carries M + M/n each way under NVLS against 2(n-1)/n M on the ring: at n 2 the
    ring is faster (its one hop moves M once), at 4 the share is 1.125/1.25 of the 8-GPU one."""
    eight, four = (float(comm.nvls_all_reduce_s(np.array([256 * MiB]), np.array([n]), H100)[0])
                   for n in (8.0, 4.0))
    assert eight / four == pytest.approx((1 + 1 / 8) / (1 + 1 / 4))  # 4 ranks: slower
    assert _all_reduce(H100, 256 * MiB, 2) == _all_reduce(RING_ONLY, 256 * MiB, 2)
    assert np.isinf(comm.nvls_all_reduce_s(np.array([MiB]), np.array([8.0]), RING_ONLY)).all()
