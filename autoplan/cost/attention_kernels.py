"""Fused attention kernels' achieved share of peak, read from the profile's figures by kernel,
dtype, length and head dim; compute.attention_core_times_s turns them into seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autoplan.hardware import (
    ATTENTION_HEAD_DIM,
    AttentionFigure,
    AttentionFigures,
    ClusterProfile,
    Curve,
)

FLASH_EFFICIENCY = 0.75
"""Fused attention runs at ~75% of the GEMM efficiency of its size (Dao 2023, FlashAttention-2:
50-73% of A100 peak forward, less backward, against ~80% for large GEMMs)."""
FLASH_BACKWARD = 2.5
"""Fused attention backward recomputes the scores: 2.5x the forward FLOPs instead of 2x."""
TRITON_FA_SLOWDOWN = (1.4, 2.0)
"""How much slower FlashAttention's Triton implementation (flash_attn_triton.py; MosaicML's
llm-foundry ran it as attn_impl: triton, with ALiBi) is than FlashAttention-2, forward and
backward: "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the
forward pass and around 2x faster in the backward pass" (Dao 2023, FlashAttention-2, §4.1,
A100 80GB, head dim 64 and 128, causal and not). The kernel "fa-triton" is priced at the
profile's FlashAttention-2 figures divided by these, on every GPU: the paper measured A100."""


def attention_efficiency(profile: ClusterProfile, kernel: str, core_flops: np.ndarray,
                         seq_len: np.ndarray | float | None = None,
                         head_dim: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) achieved / peak FLOP/s of fused attention: the profile's figures for
    `kernel` (filed as "name@dtype" first where a profile measured them per dtype, as
    profiler/precision.py does on a CPU; then by name; FlashAttention-2 where it lacks that
    one), read at `seq_len` (the tokens per sequence the kernel attends over) where the profile
    files the kernel by length, and at `head_dim` where it files the kernel at narrower heads
    (Efficiency.attention_head_dims); else FLASH_EFFICIENCY of the GEMM efficiency of the same
    FLOPs. "fa-triton": those FlashAttention-2 figures slowed by TRITON_FA_SLOWDOWN. Filed
    figures are read at the step's clock (Efficiency.attention_clock); the GEMM-based share
    already is."""
    eff = profile.efficiency
    fwd, bwd = eff.attention_forward or {}, eff.attention_backward or {}
    name, _, dtype = kernel.partition("@")
    if name == "fa-triton":
        f2, b2 = attention_efficiency(profile, f"fa2@{dtype}" if dtype else "fa2", core_flops,
                                      seq_len, head_dim)
        return f2 / TRITON_FA_SLOWDOWN[0], b2 / TRITON_FA_SLOWDOWN[1]
    filed = next((k for k in (kernel, name, "fa2") if k in fwd and k in bwd), None)
    if filed is None:
        share = eff.matmul(core_flops) * FLASH_EFFICIENCY
        return share, share

    def read(figure: AttentionFigure) -> np.ndarray:
        # at the clock the step runs the kernel at (Efficiency.attention_clock)
        return eff.attention_clock * _attention_figure(figure, core_flops, seq_len,
                                                       profile.name, filed)

    at_full = read(fwd[filed]), read(bwd[filed])
    if head_dim is None:
        return at_full
    return _by_head_dim(eff.attention_head_dims or {}, filed, head_dim, at_full, read)


def _by_head_dim(tables: dict[int, AttentionFigures], kernel: str, head_dim: float,
                 at_full: tuple[np.ndarray, np.ndarray],
                 read: Callable[[AttentionFigure], np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) figures at `head_dim`, from `at_full` (ATTENTION_HEAD_DIM's) and the
    narrower head dims `tables` files `kernel` at: linear in the width between the two filed
    dims around it, the narrowest one's below it, ATTENTION_HEAD_DIM's at and above it. Linear
    is an assumption, no measurement: FlashAttention compiles one kernel per head-dim bucket
    (64, 96, 128, ...), so an 80-wide head runs a padded 96 kernel, which no paper here times."""
    points = {ATTENTION_HEAD_DIM: at_full}
    for dim, figures in tables.items():
        if kernel in figures.forward and kernel in figures.backward:
            points[dim] = read(figures.forward[kernel]), read(figures.backward[kernel])
    dims = sorted(points)
    width = min(max(float(head_dim), dims[0]), ATTENTION_HEAD_DIM)
    upper = next(d for d in dims if d >= width)
    lower = max((d for d in dims if d <= width), default=upper)
    if upper == lower:
        return points[upper]
    w = (width - lower) / (upper - lower)
    return (points[lower][0] + w * (points[upper][0] - points[lower][0]),
            points[lower][1] + w * (points[upper][1] - points[lower][1]))


def _attention_figure(figure: AttentionFigure, like: np.ndarray,
                      seq_len: np.ndarray | float | None, profile: str, kernel: str
                      ) -> np.ndarray:
    """One figure over `like`'s shape: the share, or the by-length Curve read at `seq_len`."""
    zeros = np.zeros_like(np.asarray(like, float))
    if not isinstance(figure, Curve):
        return zeros + figure
    if seq_len is None:
        raise ValueError(f"profile {profile} files {kernel} by sequence length; pass seq_len")
    return zeros + figure(seq_len)
