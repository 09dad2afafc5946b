"""Targets.memory_slack: which allocator slack a plan must fit with (search --memory-slack)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import memory
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.search.targets import MISS_KEYS, Targets, miss_messages, miss_ratios

GIB = 2.0**30


def _cols(total: float, allocator: float) -> dict[str, np.ndarray]:
    return {"mem_total": np.array([total]), "mem_allocator": np.array([allocator]),
            "mem_host": np.array([0.0]), "num_gpus": np.array([8]),
            "tokens_per_s": np.array([1.0]), "time_step": np.array([1.0])}


def test_a_tight_plan_fits_at_the_median_and_misses_at_the_75th_percentile() -> None:
    profile = load_profile("a100-sxm4-80gb")
    cap = float(profile.device.memory_bytes)
    allocator = memory.FRAGMENTATION * 70.0 * GIB
    tight = _cols(cap - 0.5 * GIB, allocator)  # p75 adds ~2.2 GiB to a 70 GiB allocation
    oom = MISS_KEYS.index("out-of-memory")
    assert miss_ratios(tight, Targets(), profile)[0, oom] < 0
    ratio = miss_ratios(tight, Targets(memory_slack="p75"), profile)[0, oom]
    at_p75 = float(memory.total_at_p75(cap - 0.5 * GIB, allocator))
    assert ratio == pytest.approx(at_p75 / cap - 1.0) and ratio > 0
    row = {k: float(v[0]) for k, v in tight.items()}
    assert miss_messages(row, Targets(), profile) == []
    (message,) = miss_messages(row, Targets(memory_slack="p75"), profile)
    assert f"needs {at_p75 / GIB:.1f} GiB" in message and "75th-percentile" in message
    roomy = _cols(cap - 5.0 * GIB, allocator)
    assert miss_ratios(roomy, Targets(memory_slack="p75"), profile)[0, oom] < 0


def test_an_unknown_slack_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--memory-slack"):
        Targets(memory_slack="p90")
