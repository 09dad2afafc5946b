"""A `--global-batch-size A..B` range that only some layouts can take (sampled trials of the
others are rejected as batch-range, never a crash) or that none can (one-line refusal, exit 2,
naming the nearest sizes the search would try), for every sampler."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.search.batch_range import check_batch_range, tried_sizes
from autoplan.search.engine import run_search
from autoplan.search.ranges import batch_sizes
from tests.cli_refusals import assert_refused

from .conftest import request

# 24 GPUs at 96..100: dp 3, 6, 12 and 24 take 96 (dp x 2^k); dp 1, 2, 4 and 8 take no size
# (64 and 128 are the powers of two around it). It crashed pick_batch (min of an empty list).
PARTIAL = {"model": "gpt3-1.3b", "cluster": "a100-sxm4-80gb", "gpus": (24,), "gbs": 96,
           "global_batch_size_max": 100}
NONE = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--space", "small-cpu",
        "--num-gpus", "8", "--global-batch-size", "9..15", "--format", "table"]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_sampled_layout_with_no_size_in_the_range_is_rejected_not_a_crash(sampler) -> None:
    result = run_search(request("default", sampler=sampler, trials=30, seed=0, **PARTIAL))
    assert result.scored.counts["batch-range"] > 0
    assert result.best is not None
    c = result.scored.cols
    for dp, gbs in zip(c["dp"].tolist(), c["gbs"].tolist(), strict=True):
        assert gbs in batch_sizes(96, 100, dp), (dp, gbs)


def test_the_partial_range_passes_the_refusal() -> None:
    req = request("default", **PARTIAL)
    check_batch_range(req.space, req.gpu_counts, req.batch)  # no ConfigError


@pytest.mark.parametrize("sampler", ["exhaustive", "random", "tpe"])
def test_a_range_no_layout_takes_is_refused_in_one_line(capsys, sampler: str) -> None:
    """It was exit 3 "no feasible plan among 0 candidates ... raise --trials or use --sampler
    exhaustive" (exhaustive) or a traceback (random, tpe)."""
    argv = [*NONE, "--sampler", sampler] + ([] if sampler == "exhaustive" else ["--trials", "5"])
    assert_refused(capsys, argv, "--global-batch-size: 9..15 holds no size", "on 8 GPUs",
                   "powers of two and dp x 2^k, dp in 1, 2, 4, 8", "take 8 or 16")


def test_the_refusal_comes_before_out_is_made(capsys, tmp_path: Path) -> None:
    assert_refused(capsys, [*NONE, "--out", str(tmp_path / "out"), "--report",
                            str(tmp_path / "rep")], "--global-batch-size")
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_it_too() -> None:
    with pytest.raises(ConfigError, match=r"9\.\.15 holds no size"):
        run_search(request("small-cpu", gpus=(8,), gbs=9, global_batch_size_max=15,
                           sampler="random", trials=3))


@pytest.mark.parametrize(("dps", "lo", "hi", "want"), [
    ([1, 2, 4, 8], 9, 15, (8, 16)),
    ([3], 97, 100, (96, 128)),     # 3 x 32 under it; over it 128 beats 3 x 64
    ([6, 12], 50, 60, (48, 64)),
    ([5], 1, 1, (None, 2)),        # nothing under 1
])
def test_the_sizes_named_are_the_nearest_the_search_tries(dps, lo, hi, want) -> None:
    assert tried_sizes(dps, lo, hi) == want


def test_the_sizes_named_match_a_brute_force_over_batch_sizes() -> None:
    for dps in ([1], [3], [1, 2, 4, 8], [3, 6, 12, 24], [5, 7]):
        for lo in range(1, 70):
            for hi in range(lo, lo + 9):
                tried = {g for d in dps for g in batch_sizes(1, 4 * hi + 64, d)}
                under = max((g for g in tried if g < lo), default=None)
                over = min(g for g in tried if g > hi)
                assert tried_sizes(dps, lo, hi) == (under, over), (dps, lo, hi)
