"""Fused attention's share of peak as the profiles file it: by length, head dim and clock."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan.cost.attention_kernels import (
    FLASH_EFFICIENCY,
    TRITON_FA_SLOWDOWN,
    attention_efficiency,
)
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile


def test_attention_filed_by_length_runs_short_sequences_slower() -> None:
    """The H100 profiles file fused attention by sequence length from the FlashAttention-3
    paper's figures (Shah et al. 2024, Figs. 5-6: FA2's causal forward at 191 TFLOP/s for 512
    tokens, 319 at 4K, 335 at 16K); a kernel's per-query-block fixed costs weigh more when each
    query block iterates over fewer key blocks."""
    h100 = load_profile("h100-sxm-80gb")
    flops = np.full(3, 1e12)
    clock = h100.efficiency.attention_clock  # the paper's bars, at the loaded node's clock
    fwd, bwd = attention_efficiency(h100, "fa2", flops, np.array([512.0, 4096.0, 16384.0]))
    assert fwd == pytest.approx(clock * np.array([191.0, 319.0, 335.0]) / 989.0, abs=1e-3)
    assert bwd[0] < bwd[1] < bwd[2]
    # past the measured lengths the curve holds its end values
    assert attention_efficiency(h100, "fa2", flops[:1], 131072.0)[0] == pytest.approx(
        fwd[2])
    with pytest.raises(ValueError, match="seq_len"):
        attention_efficiency(h100, "fa2", flops)  # a by-length figure needs the length
    # the Triton kernel keeps its ratios to FlashAttention-2 at every length
    tri = attention_efficiency(h100, "fa-triton", flops, np.array([512.0, 4096.0, 16384.0]))
    assert tri[0] == pytest.approx(fwd / TRITON_FA_SLOWDOWN[0])
    # the A100 profiles spread the FA2 paper's 2K-8K figure over length by that kernel's H100
    # shape: the 2K-8K mean stays 0.62 forward, 512 tokens run at 0.60 of it
    a100 = load_profile("a100-sxm4-80gb")
    lengths = np.array([512.0, 2048.0, 4096.0, 8192.0, 16384.0])
    f100 = attention_efficiency(a100, "fa2", np.full(5, 1e12), lengths)[0]
    assert f100[1:4].mean() == pytest.approx(0.62 * a100.efficiency.attention_clock, abs=1e-3)
    assert f100[0] / f100[1:4].mean() == pytest.approx(191.0 / np.mean([298.0, 319.0, 333.0]),
                                                       abs=2e-3)
    assert np.all(np.diff(f100) > 0)


def test_attention_figures_are_read_at_the_loaded_node_s_clock() -> None:
    """The kernels' papers time one GPU at its boost clock; a step runs them at the clock the
    GEMM top carries (Efficiency.attention_clock): every filed figure, at every length and head
    dim, scales by it, and a profile without filed figures (a share of its GEMM curve, already
    at the loaded clock) does not."""
    h100 = load_profile("h100-sxm-80gb")
    assert h100.efficiency.attention_clock == pytest.approx(727 / 794.5, abs=1e-3)
    burst = dataclasses.replace(h100, efficiency=dataclasses.replace(h100.efficiency,
                                                                     attention_clock=1.0))
    flops, lengths = np.full(3, 1e12), np.array([512.0, 4096.0, 16384.0])
    for kernel, head_dim in (("fa2", None), ("cudnn", 64), ("fa-triton", 96)):
        loaded = attention_efficiency(h100, kernel, flops, lengths, head_dim)
        full = attention_efficiency(burst, kernel, flops, lengths, head_dim)
        for at_clock, at_burst in zip(loaded, full, strict=True):
            assert at_clock == pytest.approx(h100.efficiency.attention_clock * at_burst)
    unfiled = dataclasses.replace(h100, efficiency=dataclasses.replace(
        h100.efficiency, attention_forward=None, attention_backward=None,
        attention_head_dims=None))
    share = attention_efficiency(unfiled, "fa2", flops)[0]
    assert share == pytest.approx(h100.efficiency.matmul(flops) * FLASH_EFFICIENCY)
    with pytest.raises(ConfigError, match="attention_clock"):
        dataclasses.replace(h100.efficiency, attention_clock=0.0)
    with pytest.raises(ConfigError, match="attention_clock"):
        dataclasses.replace(h100.efficiency, attention_clock=1.2)


def test_attention_filed_by_head_dim_runs_narrow_heads_slower() -> None:
    """The H100 profiles file head dim 64 beside 128 (Shah et al. 2024, Figs. 5-6: FA2's causal
    forward 284 TFLOP/s at 4K tokens against 319; FA3's 420 against 579): a model's head width
    reads them linearly between the filed dims, the narrowest below them, 128's at and above."""
    h100 = load_profile("h100-sxm-80gb")
    flops, at_4k = np.full(1, 1e12), np.array([4096.0])
    clock = h100.efficiency.attention_clock

    def fwd(kernel: str, head_dim: float | None) -> float:
        return float(attention_efficiency(h100, kernel, flops, at_4k, head_dim)[0][0])

    assert fwd("fa2", 64) == pytest.approx(clock * 284 / 989, abs=1e-3)
    assert fwd("fa2@bf16", 64) == fwd("fa2", 64)  # as a block names it: kernel@dtype
    assert fwd("fa3", 64) == pytest.approx(clock * 420 / 989, abs=1e-3)
    assert fwd("fa2", 128) == fwd("fa2", None) == pytest.approx(clock * 319 / 989, abs=1e-3)
    assert fwd("fa2", 96) == pytest.approx((fwd("fa2", 64) + fwd("fa2", 128)) / 2)
    assert fwd("fa2", 32) == fwd("fa2", 64)  # nothing filed narrower: 64's
    assert fwd("fa2", 256) == fwd("fa2", 128)  # nothing filed wider: 128's
    bwd64 = attention_efficiency(h100, "cudnn", flops, at_4k, 64)[1]
    assert float(bwd64[0]) == pytest.approx(clock * 417 / 989, abs=1e-3)
    # a Triton kernel keeps its ratio to FlashAttention-2 at every width
    tri = attention_efficiency(h100, "fa-triton", flops, at_4k, 64)[0]
    assert float(tri[0]) == pytest.approx(fwd("fa2", 64) / TRITON_FA_SLOWDOWN[0])
    # a profile that files no narrower head dim prices every width at its one figure
    a100 = load_profile("a100-sxm4-80gb")
    assert attention_efficiency(a100, "fa2", flops, at_4k, 64)[0] == pytest.approx(
        attention_efficiency(a100, "fa2", flops, at_4k, 128)[0])
