"""fp8 plans: GEMMs at the fp8 peak, attention and the output layer at 16-bit, casts paid,
GEMM inputs saved in fp8, weight caches where the runtime keeps them; MFU against the fp8 peak."""

from __future__ import annotations

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.plan import plan_from_dict

BASE = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
        "parallel": {"dp": 8}, "zero_stage": 1,
        "batch": {"micro_batch_size": 1, "global_batch_size": 64}}


def _pair(runtime: str):
    return (estimate_plan(plan_from_dict({**BASE, "precision": "bf16"}), runtime=runtime),
            estimate_plan(plan_from_dict({**BASE, "precision": "fp8"}), runtime=runtime))


def test_fp8_is_faster_but_less_than_twice() -> None:
    bf16, fp8 = _pair("megatron")
    speedup = bf16.time["compute"] / fp8.time["compute"]
    # the GEMMs run at twice the peak; attention, norms and casts do not
    assert 1.2 < speedup < 2.0
    # MFU against each precision's own peak (NVIDIA's convention): the fp8 plan's at the fp8
    # peak, twice the bf16 one, so it reads lower although the step is faster
    from autoplan.hardware import load_profile

    peaks = load_profile("h100-sxm-80gb").device.peak_flops_per_s
    assert fp8.mfu == pytest.approx(bf16.mfu * bf16.step_time_s / fp8.step_time_s
                                    * peaks["bf16"] / peaks["fp8"])
    assert fp8.mfu < bf16.mfu


def test_fp8_memory_follows_the_runtime() -> None:
    bf16, fp8 = _pair("megatron")
    # Transformer Engine caches an fp8 weight and its transpose: 2 bytes per parameter
    assert fp8.memory["params"] - bf16.memory["params"] == pytest.approx(
        2 * bf16.num_params, rel=0.02)
    assert fp8.memory["activations"] < bf16.memory["activations"]  # fp8 GEMM inputs
    t_bf16, t_fp8 = _pair("torchtitan")
    assert t_fp8.memory["params"] == pytest.approx(t_bf16.memory["params"])  # casts on the fly


def test_fp8_needs_a_device_with_an_fp8_peak() -> None:
    plan = plan_from_dict({**BASE, "precision": "fp8",
                           "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 8}})
    est = estimate_plan(plan, runtime="megatron")
    assert not est.feasible and any("fp8" in r for r in est.reasons)


MOE = {"model": "mixtral-8x7b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
       "parallel": {"dp": 16, "pp": 4, "ep": 8}, "zero_stage": 1,
       "batch": {"micro_batch_size": 1, "global_batch_size": 256}}


def _moe(runtime, precision: str):
    return estimate_plan(plan_from_dict({**MOE, "precision": precision}), runtime=runtime)


def test_experts_a_runtime_keeps_16_bit_are_priced_16_bit() -> None:
    """autoplan's runtime swaps nn.Linear for Float8Linear and leaves its GroupedLinear experts
    16-bit (RuntimeTraits.fp8_experts False): an fp8 Mixtral, whose block GEMMs are mostly
    expert GEMMs, gains little there, and its routed tensors are saved 16-bit; the same traits
    with fp8 experts gain as Transformer Engine's grouped GEMMs do."""
    from autoplan.cost.runtimes import load_runtime, runtime_from_dict

    own = load_runtime("autoplan")
    fp8_experts = runtime_from_dict({"base": "autoplan-cuda", "fp8_experts": True})
    assert not own.fp8_experts
    bf16 = _moe(own, "bf16")
    kept, cast = _moe(own, "fp8"), _moe(fp8_experts, "fp8")
    assert kept.time["compute"] > 0.9 * bf16.time["compute"]
    assert cast.time["compute"] < 0.75 * bf16.time["compute"]
    # the routed experts' saved inputs: 16-bit where the experts are
    assert kept.memory["activations"] > cast.memory["activations"]
    assert kept.memory["activations"] < bf16.memory["activations"]  # the dense GEMMs' inputs
