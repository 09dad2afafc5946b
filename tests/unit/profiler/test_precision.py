"""bf16 against fp32 on CPU (profiler.precision): the figures it writes are what the cost model
prices the CPU runtime's attention and GEMMs with."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost.activations import activation_elements_per_layer
from autoplan.cost.block_time import block_times_s
from autoplan.cost.compute import gemm_shapes_per_layer, memory_time_s
from autoplan.cost.elementwise import attention_cast_bytes
from autoplan.cost.runtimes import RuntimeTraits, load_runtime
from autoplan.cost.step_time import priced_profile
from autoplan.hardware import profile_from_dict
from autoplan.model_spec import load_model
from autoplan.profiler import precision
from autoplan.resources import PROFILES, find
from autoplan.yaml_io import read_yaml

FIGURES = precision.PrecisionFigures(
    gemm_seconds={"fp32": 4.0e-4, "bf16": 5.0e-4},
    attention_seconds={"fp32": (1.2e-4, 2.8e-4), "bf16": (1.4e-4, 7.3e-3)},
    core_flops=4.0 * precision.BATCH * 64 * 64 * 64)


def _profile(figures: precision.PrecisionFigures):
    data = read_yaml(find(PROFILES, "cpu-gloo"), "profile")
    precision.apply_precision(data, figures)
    return profile_from_dict(data)


def _block(prof, prec: str, runtime: str | RuntimeTraits = "autoplan-cpu"
           ) -> dict[str, np.ndarray]:
    spec, traits = load_model("tiny"), load_runtime(runtime)
    b, one = np.array(float(precision.BATCH)), np.array(1.0)
    parts = activation_elements_per_layer(spec, b, one, np.array(False), one, False,
                                          fused_norm=traits.fused_norm,
                                          fused_swiglu=traits.fused_swiglu)
    return block_times_s(spec, priced_profile(prof, traits), prec, b, one, one, False, traits,
                         parts)


NO_UPCAST = replace(load_runtime("autoplan-cpu"), attention_compute_dtype=None)
"""autoplan-cpu as it was before its 16-bit attention cores ran in fp32."""


@pytest.mark.parametrize("runtime, prec, core", [
    ("autoplan-cpu", "fp32", "fp32"),
    ("autoplan-cpu", "bf16", "fp32"),  # attention_compute_dtype: fp32
    (NO_UPCAST, "bf16", "bf16"),
])
def test_the_tiny_blocks_attention_is_priced_at_the_core_dtypes_measured_seconds(
        runtime, prec, core) -> None:
    prof = _profile(FIGURES)
    fwd, bwd = FIGURES.attention_seconds[core]
    assert _block(prof, prec, runtime)["core_forward"] == pytest.approx(fwd, rel=1e-9)
    # backward: doubling the measured seconds adds exactly them to the block's backward
    slower = dict(FIGURES.attention_seconds, **{core: (fwd, 2 * bwd)})
    prof2 = _profile(precision.PrecisionFigures(FIGURES.gemm_seconds, slower,
                                                FIGURES.core_flops))
    added = _block(prof2, prec, runtime)["backward"] - _block(prof, prec, runtime)["backward"]
    assert added == pytest.approx(bwd, rel=1e-9)


def test_a_bf16_core_run_in_fp32_adds_the_casts_bytes_at_memory_speed() -> None:
    """Where bf16's and fp32's kernels take the same seconds, the upcast core costs exactly the
    casts: elementwise.attention_cast_bytes moved at the profile's element-wise bandwidth."""
    same = dict(FIGURES.attention_seconds, bf16=FIGURES.attention_seconds["fp32"])
    prof = _profile(precision.PrecisionFigures(FIGURES.gemm_seconds, same, FIGURES.core_flops))
    up, plain = _block(prof, "bf16"), _block(prof, "bf16", NO_UPCAST)
    one = np.array(1.0)
    tokens = np.array(float(precision.BATCH * load_model("tiny").seq_len))
    casts = attention_cast_bytes(load_model("tiny"), tokens, one, one)
    priced = priced_profile(prof, load_runtime("autoplan-cpu"))
    added = (up["forward"] + up["backward"]) - (plain["forward"] + plain["backward"])
    assert float(casts) > 0 and added == pytest.approx(float(memory_time_s(casts, priced)))


def test_bf16_peak_follows_the_runtime_gemm_ratio_and_gpu_kernels_ignore_cpu_figures() -> None:
    prof = _profile(FIGURES)
    assert prof.device.peak("bf16") == pytest.approx(prof.device.peak("fp32") * 4.0 / 5.0)
    # a runtime with another kernel (Megatron: cuDNN) finds no sdpa-cpu entry: share of GEMMs
    data = read_yaml(find(PROFILES, "cpu-gloo"), "profile")
    data["device"]["peak_flops_per_s"] = dict(prof.device.peak_flops_per_s)
    data["efficiency"].pop("attention_forward", None)
    data["efficiency"].pop("attention_backward", None)
    plain = profile_from_dict(data)
    assert _block(prof, "bf16", "megatron")["core_forward"] == pytest.approx(
        _block(plain, "bf16", "megatron")["core_forward"])


def test_a_bf16_curve_keeps_its_measured_bf16_peak_and_scales_fp32() -> None:
    data = read_yaml(find(PROFILES, "cpu-gloo"), "profile")
    data["device"]["peak_flops_per_s"]["bf16"] = 300e9  # as `profile --precision bf16` measured
    precision.apply_precision(data, FIGURES, curve_precision="bf16")
    prof = profile_from_dict(data)
    assert prof.device.peak("bf16") == 300e9
    assert prof.device.peak("fp32") == pytest.approx(300e9 * 5.0 / 4.0)


def test_the_timed_gemms_are_the_cost_models_gemms_of_the_tiny_block() -> None:
    spec = load_model("tiny")
    timed = {(m, n) for m, _, n in precision._gemm_shapes()}
    seq = spec.seq_len
    priced = {(int(t), int(np.asarray(n))) for tokens in (precision.BATCH * seq,
                                                           precision.BATCH * seq // 2)
              for tp in (1, 2)
              for t, n in gemm_shapes_per_layer(spec, np.array(float(tokens)), np.array(tp))}
    # row-parallel GEMMs keep the output width h and split k: their (m, n) match too
    assert timed == priced
