"""bf16 against fp32 on CPU (profiler.precision): the figures it writes are what the cost model
prices the CPU runtime's attention and GEMMs with."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.compute import gemm_shapes_per_layer
from autoplan.cost.memory import activation_elements_per_layer
from autoplan.cost.runtimes import load_runtime
from autoplan.cost.step_time import block_times_s, priced_profile
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


def _block(prof, prec: str, runtime: str = "autoplan-cpu") -> dict[str, np.ndarray]:
    spec, traits = load_model("tiny"), load_runtime(runtime)
    b, one = np.array(float(precision.BATCH)), np.array(1.0)
    parts = activation_elements_per_layer(spec, b, one, np.array(False), one, False,
                                          fused_norm=traits.fused_norm,
                                          fused_swiglu=traits.fused_swiglu)
    return block_times_s(spec, priced_profile(prof, traits), prec, b, one, one, False, traits,
                         parts)


def test_the_tiny_blocks_attention_is_priced_at_the_measured_seconds_per_dtype() -> None:
    prof = _profile(FIGURES)
    for prec in ("fp32", "bf16"):
        fwd, bwd = FIGURES.attention_seconds[prec]
        assert _block(prof, prec)["core_forward"] == pytest.approx(fwd, rel=1e-9)
        # backward: doubling the measured seconds adds exactly them to the block's backward
        slower = dict(FIGURES.attention_seconds, **{prec: (fwd, 2 * bwd)})
        prof2 = _profile(precision.PrecisionFigures(FIGURES.gemm_seconds, slower,
                                                    FIGURES.core_flops))
        added = _block(prof2, prec)["backward"] - _block(prof, prec)["backward"]
        assert added == pytest.approx(bwd, rel=1e-9)


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
