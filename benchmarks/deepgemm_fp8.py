"""DeepSeek's fine-grained FP8 GEMMs on H800, as the DeepGEMM README first tabulated them, against
what autoplan's H800 profile charges for the same GEMMs: the runtime trait fp8_gemm_efficiency of
benchmarks/deepseek_v3_runtime.yaml is derived here, not fitted to the step time.
Run: python benchmarks/deepgemm_fp8.py"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from autoplan.cost import block_time, compute
from autoplan.hardware import load_profile

SOURCE = ("deepseek-ai/DeepGEMM README.md, first release (2025-02-26), section Performance: "
          "\"We test all shapes potentially used in DeepSeek-V3/R1 inference (including both "
          "prefilling and decoding, but without tensor parallelism) on H800 with NVCC 12.8. All "
          "speedup metrics are calculated in comparison to our internally and carefully "
          "optimized implementation based on CUTLASS 3.6.\"")


@dataclass(frozen=True)
class Gemm:
    """One row of the README's tables at M = 4096 tokens (the training micro-batch: DeepSeek-V3
    trains 4096-token sequences one per micro-batch with no tensor parallelism, report §3.1 and
    §4.2, so its training GEMMs have the no-TP inference shapes) and how often a token of a MoE
    block runs it."""

    what: str
    n: int
    k: int
    tflops: float
    """DeepGEMM's measured TFLOPS (dense: M 4096; grouped contiguous: 4 groups of M 8192)."""
    speedup: float
    """DeepGEMM over DeepSeek's internal CUTLASS 3.6 kernels on the same shape."""
    per_token: int = 1
    """Times one token runs it per MoE block (8 routed experts per token)."""
    grouped: bool = False
    """Contiguous-layout grouped GEMM: 4 experts x 8192 tokens, the EP 64 training shape
    (256 experts / 64 ranks, 4096 tokens x 8 experts per rank per micro-batch, balanced)."""


V3_BLOCK_GEMMS = (
    # MLA: q and kv down projections fused (1536 + 576 = 2112), q up 128 x 192, kv up 128 x 256
    # from the 512 latent, output 128 x 128 -> 7168 (DeepSeek-V3 config.json)
    Gemm("mla q/kv down", 2112, 7168, 1058.0, 1.1),
    Gemm("mla q up", 24576, 1536, 990.0, 1.0),
    Gemm("mla kv up", 32768, 512, 590.0, 1.0),
    Gemm("mla out", 7168, 16384, 1358.0, 1.2),
    # the shared expert (2048 wide: gate+up 4096, down), dense layout
    Gemm("shared up", 4096, 7168, 1304.0, 1.1),
    Gemm("shared down", 7168, 2048, 1025.0, 1.1),
    # the 8 routed experts, grouped contiguous layout, 4 groups x M 8192
    Gemm("routed up", 4096, 7168, 1297.0, 1.2, per_token=8, grouped=True),
    Gemm("routed down", 7168, 2048, 1099.0, 1.2, per_token=8, grouped=True),
)
"""The README's rows a DeepSeek-V3 MoE block's FP8 GEMMs match (the 3 dense blocks' MLP shapes,
18432 wide, are not in the table and are priced at the same factor)."""

TOKENS = 4096
GROUP_TOKENS = 8192


def curve_seconds(g: Gemm, profile_name: str = "h800-sxm-80gb") -> float:
    """Seconds autoplan charges for one execution of the GEMM in FP8 on all SMs (the fp8 peak
    at the profile's cuBLASLt figure, block_time.profile_gemm_peak): the profile's curve with
    tile/wave quantization for a dense GEMM (compute.gemm_time_s), the curve at one expert's
    FLOPs for a grouped one (cost/moe.py moe_block_forward_s)."""
    profile = load_profile(profile_name)
    peak = block_time.profile_gemm_peak(profile, "fp8")
    if g.grouped:
        one = 2.0 * GROUP_TOKENS * g.n * g.k
        return float(4 * one / (peak * profile.efficiency.matmul(np.array(one))))
    flops = 2.0 * TOKENS * g.n * g.k
    return float(compute.gemm_time_s(np.array(flops), profile, peak,
                                     (np.array(float(TOKENS)), np.array(float(g.n)))))


SPEEDUP_ROUNDING = 0.05
"""The README prints speed-ups to 0.1x: each lies within +-0.05 of its printed value."""


def measured_seconds(g: Gemm, internal: bool = False, speedup_shift: float = 0.0) -> float:
    """Seconds at DeepGEMM's TFLOPS, or the internal CUTLASS kernels' (TFLOPS / speedup, the
    speed-up moved by `speedup_shift` within its rounding)."""
    m = 4 * GROUP_TOKENS if g.grouped else TOKENS
    rate = g.tflops * 1e12 / (g.speedup + speedup_shift if internal else 1.0)
    return 2.0 * m * g.n * g.k / rate


def fp8_gemm_efficiency(internal: bool = False, profile_name: str = "h800-sxm-80gb",
                        speedup_shift: float = 0.0) -> float:
    """Measured speed over the curve's, time-weighted over a MoE block's GEMMs per token:
    sum(curve seconds) / sum(measured seconds), each GEMM's per-execution seconds scaled to one
    token and by how often a token runs it. `speedup_shift` moves every printed speed-up
    (internal kernels only): +-SPEEDUP_ROUNDING bound what the rounded table allows."""
    def per_token(seconds: float, g: Gemm) -> float:
        return seconds / (4 * GROUP_TOKENS if g.grouped else TOKENS) * g.per_token

    curve = sum(per_token(curve_seconds(g, profile_name), g) for g in V3_BLOCK_GEMMS)
    meas = sum(per_token(measured_seconds(g, internal, speedup_shift), g)
               for g in V3_BLOCK_GEMMS)
    return curve / meas


def main() -> int:
    print(f"{'GEMM':14} {'N':>6} {'K':>6} {'DeepGEMM':>9} {'CUTLASS':>8} {'curve':>7} "
          f"{'ratio':>6}   (TFLOPS, H800, fp8 peak 1979)")
    for g in V3_BLOCK_GEMMS:
        m = 4 * GROUP_TOKENS if g.grouped else TOKENS
        curve = 2.0 * m * g.n * g.k / curve_seconds(g) / 1e12
        print(f"{g.what:14} {g.n:6} {g.k:6} {g.tflops:9.0f} {g.tflops / g.speedup:8.0f} "
              f"{curve:7.0f} {g.tflops / curve:6.2f}")
    low, high = (fp8_gemm_efficiency(internal=True, speedup_shift=d)
                 for d in (SPEEDUP_ROUNDING, -SPEEDUP_ROUNDING))
    print(f"fp8_gemm_efficiency, DeepGEMM: {fp8_gemm_efficiency():.3f}; internal CUTLASS 3.6: "
          f"{fp8_gemm_efficiency(internal=True):.3f} ({low:.3f}-{high:.3f} with every speed-up "
          f"anywhere in its 0.1x rounding)")
    print(f"source: {SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
