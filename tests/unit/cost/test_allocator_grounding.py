"""The allocator slack the cost model adds (memory.FRAGMENTATION) is the figure its data file
gives: the median stranded share of published training OOM messages."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from autoplan.cost import memory

DATA = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "allocator-oom.yaml"
SAMPLE_KEYS = {"source", "framework", "kind", "at_load", "shared_gpu", "expandable_segments",
               "capacity_gib", "tried_gib", "allocated_gib", "unallocated_gib", "note"}


def _samples() -> list[dict]:
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    assert set(data) == {"schema_version", "samples"}
    return data["samples"]


def test_every_sample_is_whole_and_consistent():
    samples = _samples()
    assert len(samples) >= 30
    for s in samples:
        assert set(s) == SAMPLE_KEYS, s
        assert s["kind"] in ("training", "inference")
        assert 0.0 < s["allocated_gib"] and 0.0 <= s["unallocated_gib"]
        # what PyTorch held fits on the GPU it reported
        assert s["allocated_gib"] + s["unallocated_gib"] <= s["capacity_gib"] * 1.01, s
    keys = [(s["allocated_gib"], s["unallocated_gib"], s["capacity_gib"]) for s in samples]
    assert len(set(keys)) == len(keys), "a message counted twice"


def test_fragmentation_is_the_median_stranded_share_of_training_peaks():
    step = [s for s in _samples() if s["kind"] == "training" and s["allocated_gib"] >= 20
            and not s["at_load"] and not s["shared_gpu"]]
    assert len(step) >= 30
    median = statistics.median(s["unallocated_gib"] / s["allocated_gib"] for s in step)
    assert memory.FRAGMENTATION == pytest.approx(median, abs=5e-4)
    shares = [s["unallocated_gib"] / s["allocated_gib"] for s in step]
    assert memory.FRAGMENTATION_P75 == pytest.approx(float(np.percentile(shares, 75)), abs=5e-4)


def test_tight_is_a_fit_at_the_median_slack_that_the_75th_percentile_would_miss():
    """tight_by_bytes: 0 with room to spare and 0 for a plan that does not fit at all (a miss,
    not tight); in between, the bytes the p75 slack would add past the capacity."""
    gib = 2.0**30
    allocated = 70.0 * gib
    slack = memory.FRAGMENTATION * allocated
    total = allocated + slack
    extra = (memory.FRAGMENTATION_P75 - memory.FRAGMENTATION) * allocated
    assert float(memory.tight_by_bytes(total, slack, total + extra + gib)) == 0.0
    assert float(memory.tight_by_bytes(total, slack, total - 1.0)) == 0.0
    assert float(memory.tight_by_bytes(total, slack, total)) == pytest.approx(extra, rel=1e-9)
    assert float(memory.tight_by_bytes(total, slack, total + extra / 2)) == \
        pytest.approx(extra / 2, rel=1e-9)


def test_the_slack_is_priced_on_every_allocated_byte():
    """mem_allocator is FRAGMENTATION times the states, activations and buffers of the stage
    it prices, and the total adds it and the device reserve to them."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan

    plan = Plan(model="gpt3-1.3b", cluster=ClusterRef("a100-sxm4-80gb", 8),
                parallel=Parallel(dp=8), batch=Batch(micro_batch_size=4, global_batch_size=32),
                zero_stage=1)
    mem = estimate_plan(plan).memory
    held = (mem["params"] + mem["grads"] + mem["optimizer"] + mem["activations"]
            + mem["buffers"])
    assert mem["allocator"] == pytest.approx(memory.FRAGMENTATION * held, rel=1e-12)
    assert mem["total"] == pytest.approx(held + mem["allocator"] + mem["reserved"], rel=1e-12)
