"""bf16 against fp32 on a CPU, measured on the runtime's own block shapes: the GEMMs' speed ratio
(which sets the profile's bf16 peak) and SDPA's fused attention forward and backward per dtype
(which the cost model prices as the `sdpa-cpu` kernel, see cost/runtime_presets.py `autoplan-cpu`).

Why both: on a CPU with AMX/AVX512-BF16 a bf16 GEMM of the tiny block's size runs 0.8-1.6x
fp32's speed (large square ones 6-7x), while torch's CPU flash-attention backward in bf16
(aten::_scaled_dot_product_flash_attention_for_cpu_backward) runs 10-45x slower than in fp32 at
the tiny block's 64 tokens and head dim 16 (measured with torch 2.13 on the 2-core development
machine, 2026-12-01). Neither follows from the fp32 figures. So autoplan's CPU runtime computes
a 16-bit plan's attention core in fp32 (RuntimeTraits.attention_compute_dtype); the attention
is timed through the runtime's own Attention.core, that path included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from autoplan.profiler.compute import time_call

ATTENTION_KERNEL = "sdpa-cpu"
"""The kernel name the CPU profile's attention figures are filed under (cost/compute.py looks
up `kernel@precision` first)."""
BATCH = 4
"""Micro-batch of the timed attention and GEMMs: the closed loop's and README's tiny plans."""
MIN_EFF = 0.001


@dataclass(frozen=True)
class PrecisionFigures:
    gemm_seconds: dict[str, float]
    """Seconds of the tiny block's forward GEMMs (at BATCH and BATCH/2 sequences, tp 1 and 2)
    by dtype."""
    attention_seconds: dict[str, tuple[float, float]]
    """(forward, backward) seconds of one causal SDPA call of the tiny block by dtype."""
    core_flops: float
    """attention_core_flops of that call (the full s^2 square, as the cost model counts it)."""
    runtime_attention_seconds: dict[str, tuple[float, float]] = field(default_factory=dict)
    """(forward, backward) seconds of that call as autoplan's CPU runtime runs a plan of each
    16-bit dtype (its core in attention_compute_dtype, the casts included), for the record:
    the cost model prices it from the compute dtype's figures plus the casts' bytes."""


def _gemm_shapes() -> list[tuple[int, int, int]]:
    """(tokens, in, out) of each forward GEMM of the tiny block, as F.linear runs them."""
    from autoplan.model_spec import load_model

    spec = load_model("tiny")
    h, f, seq = spec.hidden_size, spec.ffn, spec.seq_len
    out = []
    for tokens in (BATCH * seq, BATCH * seq // 2):
        for tp in (1, 2):
            out += [(tokens, h, 3 * h // tp), (tokens, h // tp, h), (tokens, h, f // tp),
                    (tokens, f // tp, h)]
    return out


def gemm_seconds(dtype: torch.dtype, repeats: int) -> float:
    """Summed seconds of the tiny block's GEMMs in `dtype` (weights as nn.Linear keeps them)."""
    total = 0.0
    for m, k, n in _gemm_shapes():
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        total += time_call(lambda x=x, w=w: F.linear(x, w), torch.device("cpu"), repeats,
                           warmup=3)
    return total


def attention_seconds(dtype: torch.dtype, repeats: int, runtime_path: bool = False
                      ) -> tuple[float, float]:
    """(forward, backward) seconds of the tiny block's causal attention core (BATCH x heads x
    seq x d inputs in `dtype`) through the runtime's Attention.core: SDPA in `dtype`, or with
    `runtime_path` the kernel in the dtype autoplan's CPU runtime computes it in (set_attention
    on "cpu"). Backward is torch.autograd.grad, so no leaf gradient is accumulated (a bf16
    accumulation into q, k, v would be timed with it)."""
    from autoplan.model_spec import load_model
    from autoplan.plan import Attention as AttentionKind
    from autoplan.runtime.models.layers import Attention, set_attention

    spec = load_model("tiny")
    layer = Attention(spec)
    if runtime_path:
        set_attention(layer, AttentionKind.FLASH, "cpu")
    shape = (BATCH, spec.num_heads, spec.seq_len, spec.head_width)
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, dtype=dtype)
    cpu = torch.device("cpu")
    forward = time_call(lambda: layer.core(q, k, v), cpu, repeats, warmup=3)

    def both() -> None:
        torch.autograd.grad(layer.core(q, k, v), (q, k, v), grad)

    return forward, max(time_call(both, cpu, repeats, warmup=3) - forward, forward * 0.1)


def measure_precision(quick: bool) -> PrecisionFigures:
    """bf16 and fp32 GEMMs and attention of the tiny block on this CPU (one thread): each
    dtype's own SDPA, and bf16 attention as the runtime runs it."""
    from autoplan.cost.compute import attention_core_flops
    from autoplan.model_spec import load_model

    repeats = 15 if quick else 40
    gemms, attn = {}, {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        gemms[name] = gemm_seconds(dtype, repeats)
        attn[name] = attention_seconds(dtype, repeats)
    runtime = {"bf16": attention_seconds(torch.bfloat16, repeats, runtime_path=True)}
    one = np.array(1.0)
    core = float(attention_core_flops(load_model("tiny"), np.array(float(BATCH)), one, one))
    return PrecisionFigures(gemms, attn, core, runtime)


def attention_efficiency(seconds: tuple[float, float], core_flops: float, peak: float,
                         causal_skip: bool) -> tuple[float, float]:
    """(forward, backward) achieved / peak as cost/compute.layer_times_s prices fused attention:
    forward = work / (peak * eff), backward = FLASH_BACKWARD * work / (peak * eff), with work
    half the square where the runtime's kernel skips masked tiles. Not capped at 1: the other
    dtype's peak is inferred from the GEMMs' time ratio (apply_precision), and on a CPU without
    native bf16 GEMMs (12x slower than fp32 on this project's 2-core machines) bf16 attention
    beats that inferred peak; a cap would misprice the seconds it measured."""
    from autoplan.cost.attention_kernels import FLASH_BACKWARD

    work = (0.5 if causal_skip else 1.0) * core_flops
    fwd, bwd = seconds

    def frac(v: float) -> float:
        return float(max(MIN_EFF, v))

    return frac(work / (peak * fwd)), frac(FLASH_BACKWARD * work / (peak * bwd))


def apply_precision(prof: dict[str, Any], figures: PrecisionFigures,
                    curve_precision: str = "fp32") -> None:
    """Write the other dtype's peak and the per-dtype attention figures into a CPU profile.

    The cost model keeps one GEMM efficiency curve by size, measured in `curve_precision` (fp32
    on a CPU unless `profile --precision bf16`); the other dtype's peak is that one's scaled by
    the measured time ratio of the runtime's own GEMMs, so the curve prices its GEMMs of that
    size as they ran. Attention is filed per dtype under ATTENTION_KERNEL@precision as
    fractions of that dtype's peak."""
    from autoplan.cost.runtimes import load_runtime

    peaks = prof["device"]["peak_flops_per_s"]
    other = "bf16" if curve_precision == "fp32" else "fp32"
    # float(): YAML 1.1 reads 115.0e9 (no exponent sign) as a string
    peaks[other] = float(peaks[curve_precision]) * figures.gemm_seconds[curve_precision] \
        / figures.gemm_seconds[other]
    skip = load_runtime("autoplan-cpu").causal_attention_skip
    eff = prof["efficiency"]
    fwd_table = dict(eff.get("attention_forward") or {})
    bwd_table = dict(eff.get("attention_backward") or {})
    for name, seconds in figures.attention_seconds.items():
        fwd, bwd = attention_efficiency(seconds, figures.core_flops, float(peaks[name]), skip)
        fwd_table[f"{ATTENTION_KERNEL}@{name}"] = fwd
        bwd_table[f"{ATTENTION_KERNEL}@{name}"] = bwd
    eff["attention_forward"], eff["attention_backward"] = fwd_table, bwd_table
    prof.setdefault("measured", {})["precision"] = {
        "gemm_seconds": dict(figures.gemm_seconds),
        "attention_seconds": {k: list(v) for k, v in figures.attention_seconds.items()},
        "runtime_attention_seconds": {k: list(v) for k, v in
                                      figures.runtime_attention_seconds.items()},
        "attention_core_flops": figures.core_flops, "batch": BATCH}
