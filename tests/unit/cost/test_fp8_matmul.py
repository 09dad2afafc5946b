"""Efficiency.fp8_matmul: FP8 GEMMs priced at the share of the fp8 peak the device's cuBLASLt FP8
kernels reach against the curve (H100/H200 tables in benchmarks/data/gemm-published.yaml); 16-bit
GEMMs, attention and everything else untouched; a runtime's own FP8 kernels scale it again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost import block_time
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile, profile_from_dict
from autoplan.plan import plan_from_dict
from autoplan.yaml_io import to_dict

H100 = load_profile("h100-sxm-80gb")
PLAN = {"model": "llama-3.1-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
        "parallel": {"dp": 8}, "zero_stage": 3,
        "batch": {"micro_batch_size": 1, "global_batch_size": 8}}


def _with_fp8_matmul(value: float):
    return replace(H100, efficiency=replace(H100.efficiency, fp8_matmul=value))


def test_only_fp8_gemms_take_the_figure_and_a_runtime_s_kernels_scale_it_again() -> None:
    megatron, deepseek = load_runtime("megatron"), replace(load_runtime("megatron"),
                                                           fp8_gemm_efficiency=0.8)
    fp8, bf16 = H100.device.peak("fp8"), H100.device.peak("bf16")
    assert H100.efficiency.fp8_matmul == 0.96
    assert block_time.profile_gemm_peak(H100, "fp8") == pytest.approx(0.96 * fp8)
    assert block_time.gemm_peak(H100, "fp8", megatron) == pytest.approx(0.96 * fp8)
    assert block_time.gemm_peak(H100, "fp8", deepseek) == pytest.approx(0.8 * 0.96 * fp8)
    assert block_time.gemm_peak(H100, "bf16", deepseek) == bf16  # 16-bit: neither factor
    assert block_time.sixteen_bit_peak(H100, "fp8") == bf16  # attention and head stay 16-bit


def test_an_fp8_step_slows_by_its_gemms_alone_and_a_bf16_step_not_at_all() -> None:
    """Lowering the figure lengthens an fp8 plan's compute by less than the figure's ratio (its
    attention, norms and casts are not FP8 GEMMs) and leaves its MFU's peak, and every bf16
    plan, where they were."""
    runtime = load_runtime("megatron")
    fp8_plan, bf16_plan = (plan_from_dict({**PLAN, "precision": p}) for p in ("fp8", "bf16"))

    def est(plan, value: float):
        return estimate_plan(plan, ClusterSpec(_with_fp8_matmul(value), 8), runtime=runtime)

    full, measured = est(fp8_plan, 1.0), est(fp8_plan, 0.96)
    ratio = measured.time["compute"] / full.time["compute"]
    assert 1.0 < ratio < 1 / 0.96
    assert measured.mfu == pytest.approx(full.mfu * full.time["step"] / measured.time["step"])
    assert est(bf16_plan, 1.0).time == est(bf16_plan, 0.5).time


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.6, "fast"])
def test_a_profile_refuses_an_fp8_figure_that_is_no_ratio(bad) -> None:
    data = to_dict(H100)
    data["efficiency"]["fp8_matmul"] = bad
    with pytest.raises(ConfigError, match="fp8_matmul") as err:
        profile_from_dict(data)
    assert err.value.exit_code == 2
    data["efficiency"]["fp8_matmul"] = 1.5  # FP8 faster than the curve may be measured, up to it
    assert profile_from_dict(data).efficiency.fp8_matmul == 1.5
