"""A GPU profile's memory is what CUDA gives a process (cudaMemGetInfo's total, the "total
capacity" of PyTorch's out-of-memory message and what `autoplan profile` measures), not the
datasheet's round figure: on an A100 80GB that is 79.35 GiB, and a plan priced between the two
does not run.

BigScience's layout search for BLOOM (benchmarks/data/bloom-tr11-topology.yaml, the tr11
chronicles' prequel, 2022-02-28) records one such layout: DP 16 / TP 4 / PP 6 at micro-batch 2
for the 184B, 64-head model ran out of memory on Jean Zay's A100 80GB the day its neighbours
ran. Priced at 79.9 GiB it fitted the datasheet's 80 GiB."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from autoplan.hardware import load_profile
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[3]
BENCH = load_script("practitioner")
BLOOM = BENCH.load_data(ROOT / "benchmarks" / "data" / "bloom-tr11-topology.yaml")

PYTORCH_TOTAL_GIB = {
    # torch's OOM message / get_device_properties().total_memory for each part
    "a100-sxm4-80gb": 79.35, "a100-80gb-opa": 79.35, "a100-sxm4-40gb": 39.59,
    "v100-sxm2-32gb": 31.75, "h100-sxm-80gb": 79.19, "h800-sxm-80gb": 79.19,
    "h200-sxm-141gb": 139.80,
}


@pytest.mark.parametrize("name", sorted(PYTORCH_TOTAL_GIB))
def test_gpu_profiles_hold_the_memory_cuda_gives_a_process(name: str) -> None:
    assert load_profile(name).device.memory_bytes / 2**30 == pytest.approx(
        PYTORCH_TOTAL_GIB[name], abs=0.005)


def _estimate(entry):
    plan, model, cluster = BENCH.build(entry)
    return BENCH._estimate(plan, cluster, model, BENCH.row_runtime(entry))


def test_the_bloom_layout_that_ran_out_of_memory_is_priced_not_to_fit() -> None:
    ran = next(e for e in BLOOM if e["id"] == "bloom-prelim-184b-a64-dp8-tp8-pp6-m2")
    oom = copy.deepcopy(ran)
    oom["plan"]["parallel"].update(dp=16, tp=4, pp=6)
    est = _estimate(oom)
    assert not est.feasible
    assert est.memory_total_bytes > load_profile("a100-80gb-opa").device.memory_bytes


@pytest.mark.parametrize("entry", BLOOM, ids=[e["id"] for e in BLOOM])
def test_every_bloom_layout_that_ran_is_priced_to_fit(entry) -> None:
    assert _estimate(entry).feasible
