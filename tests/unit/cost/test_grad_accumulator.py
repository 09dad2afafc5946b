"""RuntimeTraits.grad_accumulate_bytes: a runtime that adds every micro-batch's 16-bit gradients
into an accumulator of its own (nanotron's FP32GradientAccumulator) pays the bytes once per
micro-batch for every parameter of the rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime, runtime_from_dict
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict


def _plan(global_batch: int, pp: int = 1):
    return plan_from_dict({"model": "llama-3-8b",
                           "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
                           "parallel": {"dp": 8 // pp, "pp": pp}, "zero_stage": 1,
                           "batch": {"micro_batch_size": 1,
                                     "global_batch_size": global_batch}})


def _optimizer_s(plan, runtime) -> float:
    cluster = ClusterSpec(load_profile("h100-sxm-80gb"), 8)
    return float(estimate_plan(plan, cluster, runtime=runtime).time["optimizer"])


def test_nanotron_pays_its_accumulator_once_per_micro_batch() -> None:
    nanotron = load_runtime("nanotron")
    assert nanotron.grad_accumulate_bytes == 10.0 and not nanotron.adds_into_grad_buffer
    without = replace(nanotron, grad_accumulate_bytes=0.0)
    doubled = replace(nanotron, grad_accumulate_bytes=20.0)
    # 8 and 16 micro-batches per rank (dp 8, micro-batch 1)
    extra = {gbs: _optimizer_s(_plan(gbs), nanotron) - _optimizer_s(_plan(gbs), without)
             for gbs in (64, 128)}
    assert extra[64] > 0.0
    assert extra[128] == pytest.approx(2.0 * extra[64], rel=1e-9)
    assert _optimizer_s(_plan(64), doubled) - _optimizer_s(_plan(64), without) == \
        pytest.approx(2.0 * extra[64], rel=1e-9)
    # every parameter of the rank, at the profile's memory-bound rate: Llama 3 8B's ~8.0e9
    profile = load_profile("h100-sxm-80gb")
    rate = profile.device.hbm_bytes_per_s * profile.efficiency.memory_bound
    params = extra[64] * rate / (8 * 10.0)
    assert 7.9e9 < params < 8.1e9


def test_a_pipeline_stage_accumulates_only_its_own_parameters() -> None:
    nanotron = load_runtime("nanotron")
    without = replace(nanotron, grad_accumulate_bytes=0.0)
    flat, piped = _plan(64), _plan(64, pp=2)
    extra_flat = _optimizer_s(flat, nanotron) - _optimizer_s(flat, without)
    extra_piped = _optimizer_s(piped, nanotron) - _optimizer_s(piped, without)
    # pp 2: half the layers a rank, twice the micro-batches (dp 4)
    assert 0.8 < extra_piped / extra_flat < 1.2 and extra_piped != extra_flat


def test_the_other_presets_accumulate_in_place() -> None:
    for name in ("megatron", "torchtitan", "autoplan-cuda"):
        assert load_runtime(name).grad_accumulate_bytes == 0.0


@pytest.mark.parametrize("value", [-1.0, 40.0])
def test_a_traits_file_with_an_unlikely_accumulator_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="grad_accumulate_bytes"):
        runtime_from_dict({"schema_version": 1, "base": "nanotron",
                           "grad_accumulate_bytes": value})
