"""Compute: FLOPs of a transformer and the time a GPU needs for them.

FLOPs: Narayanan et al. 2021 (SC21) eq. 3, 72*B*s*L*h^2*(1 + s/6h + V/12Lh) per step for GPT;
here each GEMM is counted on its own, so grouped-query attention and SwiGLU are exact too.
Time: every GEMM runs at the profile's efficiency for its size (small GEMMs are slow), the
element-wise work is bounded by memory bandwidth (Korthikanti et al. 2022 count the bytes).
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
from autoplan.model_spec import ModelSpec, NormKind, PositionKind

ELEMENTWISE_PASSES = 3.3
"""HBM bytes moved by norms, activation functions, bias/dropout/residual kernels per byte of
activation kept for backward: forward reads and writes each tensor about once (38sbh moved per
34sbh kept for GPT) and backward moves about twice that (inputs, saved tensors, gradients)."""
SOFTMAX_PASSES = 5.4
"""Same for the eager attention core (scale, mask, softmax, dropout): 9as^2b moved forward per
5as^2b kept, twice that backward."""
FLASH_EFFICIENCY = 0.75
"""Fused attention runs at ~75% of the GEMM efficiency of its size (Dao 2023, FlashAttention-2:
50-73% of A100 peak forward, less backward, against ~80% for large GEMMs)."""
BLOCK_OPS = (39, 97, 6)
"""aten operators a GPT block (LayerNorm, GELU MLP, biases, multi-head fused attention)
dispatches forward, backward, and how many forward ones are GEMMs: counted on the runtime's
block with a TorchDispatchMode (autoplan.profiler.dispatch; tests/unit/cost/test_compute.py
recounts them). The changes below are counted the same way, one feature at a time."""
BLOCK_OPS_DELTA = {
    "rmsnorm": (12, 30, 0),  # composite RMSNorm: pow, mean, add, rsqrt, casts, per norm x2
    "rope": (38, 24, 0),  # rotary embedding of q and k: reshapes, complex-free mul/add
    "swiglu": (5, 15, 1),  # a third MLP GEMM and the gate's silu * up
    "no_bias": (0, -20, 0),  # mm instead of addmm: same forward count, no bias gradients
    "qkv_bias": (0, 9, 0),  # a no_bias block with q, k and v biased: their gradients back
    "qk_norm": (14, 36, 0),  # composite RMSNorms of q and k over head_dim (Qwen3), 7 ops each
    "gqa": (8, 8, 0),  # repeating K and V heads to the query heads
    "eager": (4, 8, 2),  # scores and weights matmuls, scale, mask, softmax instead of SDPA
}
EAGER_BYTES_PER_TOKEN = {
    NormKind.LAYERNORM: {"h": 58.0, "f": 10.6, "q": 43.2, "kv": -17.0, "const": -166.9},
    NormKind.RMSNORM: {"h": 344.9, "f": 35.0, "q": 138.0, "kv": 88.0, "const": 169.0},
}
"""Bytes the element-wise ops of one block of eager PyTorch move per token, forward + backward,
bf16: c_h*h + c_f*f + c_q*(a*d) + c_kv*(kv*d) + c_0. Counted, not fitted: every non-GEMM,
non-attention, non-view aten op's inputs and outputs of autoplan's runtime block (the GPT-style
family with LayerNorm, GELU, learned positions; the Llama-style family with RMSNorm, SwiGLU,
RoPE, GQA), solved exactly from blocks of six shapes (autoplan.profiler.traffic;
tests/unit/profiler/test_traffic.py recounts them). The Llama family's count holds torch's
composite RMSNorm (COMPOSITE_RMSNORM_BYTES per element); a fused one moves FUSED_NORM_BYTES."""
COMPOSITE_RMSNORM_BYTES = 153.4
"""Bytes per element of torch's composite RMSNorm, forward + backward, bf16 (counted likewise)."""
FUSED_NORM_BYTES = 20.5
"""Bytes per element of a fused norm kernel (native_layer_norm and its backward), counted."""
FLASH_BACKWARD = 2.5
"""Fused attention backward recomputes the scores: 2.5x the forward FLOPs instead of 2x."""
TRITON_FA_SLOWDOWN = (1.4, 2.0)
"""How much slower FlashAttention's Triton implementation (flash_attn_triton.py; MosaicML's
llm-foundry ran it as attn_impl: triton, with ALiBi) is than FlashAttention-2, forward and
backward: "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the
forward pass and around 2x faster in the backward pass" (Dao 2023, FlashAttention-2, §4.1,
A100 80GB, head dim 64 and 128, causal and not). The kernel "fa-triton" is priced at the
profile's FlashAttention-2 figures divided by these, on every GPU: the paper measured A100."""


def block_ops(model: ModelSpec, eager: bool = False) -> tuple[int, int, int]:
    """(forward, backward, forward GEMM) aten op counts of one block of the runtime."""
    flags = {"rmsnorm": model.norm is NormKind.RMSNORM,
             "rope": model.position is PositionKind.ROPE,
             "swiglu": model.gated_mlp,  # GeGLU dispatches as SwiGLU does (gelu for silu)
             "no_bias": not model.bias, "qkv_bias": model.qkv_bias and not model.bias,
             "qk_norm": model.qk_norm, "gqa": model.kv_heads != model.num_heads,
             "eager": eager}
    f, b, g = BLOCK_OPS
    for name in (k for k, on in flags.items() if on):
        df, db, dg = BLOCK_OPS_DELTA[name]
        f, b, g = f + df, b + db, g + dg
    return f, b, g


def gemm_flops_per_layer(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray) -> list[np.ndarray]:
    """Forward FLOPs of each GEMM of one block on one tp rank, for `tokens` tokens."""
    t = np.asarray(tokens, float)
    tp = np.asarray(tp, float)
    h, f = model.hidden_size, model.ffn
    kv_width, q_width = model.kv_heads * model.head_width, model.q_width
    gemms = [2 * t * h * (q_width + 2 * kv_width) / tp, 2 * t * q_width * h / tp]
    if model.gated_mlp:
        gemms += [2 * t * h * 2 * f / tp, 2 * t * f * h / tp]  # gate+up fused, then down
    else:
        gemms += [2 * t * h * f / tp, 2 * t * f * h / tp]
    return gemms


def gemm_shapes_per_layer(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows m, columns n) of each GEMM's output in gemm_flops_per_layer's order, on one tp
    rank: m = tokens, n = the output width (column-parallel GEMMs split it by tp; row-parallel
    ones keep h and split k, which quantization does not see)."""
    t, tp = np.asarray(tokens, float), np.asarray(tp, float)
    h, f = model.hidden_size, model.ffn
    kv_width, q_width = model.kv_heads * model.head_width, model.q_width
    up = 2 * f if model.gated_mlp else f
    return [(t, (q_width + 2 * kv_width) / tp), (t, h + 0 * tp), (t, up / tp), (t, h + 0 * tp)]


def quantization_efficiency(m: np.ndarray, n: np.ndarray, profile: ClusterProfile) -> np.ndarray:
    """Share of the GPU's tile slots a GEMM with an m x n output keeps busy (NVIDIA, "Matrix
    Multiplication Background User's Guide", tile and wave quantization): the output is cut into
    ceil(m/T_m) * ceil(n/T_n) tiles, run in waves of one tile per SM; a partial tile or a partial
    last wave runs at the cost of a full one."""
    dev = profile.device
    if dev.sm_count is None:
        return np.ones_like(np.asarray(m, float))
    tm, tn = dev.gemm_tile
    m, n = np.maximum(np.asarray(m, float), 1.0), np.maximum(np.asarray(n, float), 1.0)
    tiles = np.ceil(m / tm) * np.ceil(n / tn)
    waves = np.ceil(tiles / dev.sm_count)
    return (m * n) / (waves * dev.sm_count * tm * tn)


def attention_core_flops(model: ModelSpec, b: np.ndarray, tp: np.ndarray, cp: np.ndarray) -> np.ndarray:
    """QK^T and attention-times-V forward FLOPs per rank: 4*b*s^2*(a*d) (a*d = h unless head_dim
    is set apart), split by tp and cp (full square, as the papers count it, though causal
    kernels skip half)."""
    return 4.0 * np.asarray(b, float) * model.seq_len**2 * model.q_width / (
        np.asarray(tp, float) * np.asarray(cp, float))


def model_flops_per_sequence(model: ModelSpec) -> float:
    """Model FLOPs (forward + backward, no recompute) to train on one sequence."""
    s = model.seq_len
    layer = sum(float(g) for g in gemm_flops_per_layer(model, np.array(s), np.array(1)))
    layer += float(attention_core_flops(model, np.array(1), np.array(1), np.array(1)))
    logits = 2.0 * s * model.hidden_size * model.vocab_size
    return 3.0 * (model.num_layers * layer + logits)


def gemm_time_s(flops: np.ndarray, profile: ClusterProfile, peak: float,
                shape: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Seconds of one GEMM. Given its output shape and a device with an SM count, the GEMM runs
    its padded work (NVIDIA, "Matrix Multiplication Background User's Guide": partial tiles
    and a partial last wave cost as much as full ones: flops / quantization_efficiency) at
    the profile's efficiency for that much work. The datasheet profiles' curves top out at
    best-shape rates (the MAMF figures their comments cite), so a shape pays its own
    quantization in full; and the padded work only shrinks as a GEMM does, so halving a
    rank's work (tp, cp) never makes it slower. A measured profile's curve was read from this
    machine's own GEMMs, quantization included, so it prices the FLOPs as they are."""
    if shape is not None and profile.measured is None:
        padded = flops / quantization_efficiency(shape[0], shape[1], profile)
        return padded / (peak * profile.efficiency.matmul(padded))
    return flops / (peak * profile.efficiency.matmul(flops))


def memory_time_s(nbytes: np.ndarray, profile: ClusterProfile) -> np.ndarray:
    return nbytes / (profile.device.hbm_bytes_per_s * profile.efficiency.memory_bound)


def op_sac_recomputed_gemm_share(model: ModelSpec, early_stop: bool = False) -> float:
    """Share of a block's GEMM FLOPs torchtitan's op-level selective checkpointing re-runs: it
    saves every second matmul's output in forward order wq, wk, wv, wo, w1, w3, w2 (GELU: wq,
    wk, wv, wo, w1, w2), so wk, wo and w3 (GELU: wk, wo, w2) run again; but a checkpoint that
    stops early (`early_stop`, RuntimeTraits.recompute_early_stop) stops before GELU's w2,
    whose output no backward needs (w3's output SwiGLU's product does)."""
    h, f, q, kv = model.hidden_size, model.ffn, model.q_width, model.kv_heads * model.head_width
    total = h * (q + 2 * kv) + q * h + (3 if model.gated_mlp else 2) * h * f
    again = h * kv + q * h + (h * f if model.gated_mlp or not early_stop else 0)
    return again / total


def eager_elementwise_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray,
                            sp: np.ndarray, fused_norm: bool, precision: str) -> np.ndarray:
    """EAGER_BYTES_PER_TOKEN of one block on one rank: widths split by tp, the h-wide ops
    (norms, residuals) split only under sequence parallelism; with model.qk_norm, the q and k
    norms at a norm's bytes per element (COMPOSITE_RMSNORM_BYTES, FUSED_NORM_BYTES)."""
    c = EAGER_BYTES_PER_TOKEN[model.norm]
    tp = np.asarray(tp, float)
    sp_div = np.where(np.asarray(sp), tp, 1.0)
    h, f = model.hidden_size, model.ffn
    q, kv = model.q_width, model.kv_heads * model.head_width
    per_h = c["h"] - (2.0 * (COMPOSITE_RMSNORM_BYTES - FUSED_NORM_BYTES)
                      if fused_norm and model.norm is NormKind.RMSNORM else 0.0)
    per_token = per_h * h / sp_div + (c["f"] * f + c["q"] * q + c["kv"] * kv) / tp + c["const"]
    if model.qk_norm:  # the per-head norms of q and k (Qwen3), split by tp with their heads
        per_token = per_token + (FUSED_NORM_BYTES if fused_norm else COMPOSITE_RMSNORM_BYTES
                                 ) * (q + kv) / tp
    width = 2.0 if precision == "fp32" else 1.0
    return np.maximum(per_token, 0.0) * np.asarray(tokens, float) * width


def fused_elementwise_bytes(model: ModelSpec, parts: dict[str, np.ndarray], tokens: np.ndarray,
                            tp: np.ndarray, sp: np.ndarray, precision: str) -> np.ndarray:
    """HBM bytes the fused element-wise kernels of one block move on one rank per micro-batch,
    forward + backward (a runtime with fused kernels: Megatron-Core + Transformer Engine, Apex,
    DeepSpeed's Megatron fork), counted by kernel from the block's kept tensors (`parts`:
    memory.activation_elements_per_layer's 16-bit bytes on this rank). Forward: the 2 norms
    read their inputs (`norm`) and write their outputs (`gemm_in`); the 2 bias-dropout-add
    kernels read the branch and the residual and write the sum (3 h-wide tensors each) and
    their dropout masks (`masks`); the activation reads the first MLP GEMM's output
    (`mlp_act`) and writes the second's input (`mlp_mid`; the routed experts' too, as memory
    counts them); RoPE reads and writes q and k, and so do QK-norms (model.qk_norm, Qwen3).
    Backward moves about twice the forward (inputs, saved tensors, gradients):
    ELEMENTWISE_PASSES' 3x over the forward. Norms and
    residuals are h-wide on every tensor-parallel rank unless sequence parallelism shards them.
    For GPT this is Korthikanti et al. 2022's §4.1 count: 22sbh h-wide (2 LayerNorms at 4sbh,
    2 bias-dropout-adds at 7sbh) and 16sbh tp-split (bias-GeLU) forward, 38sbh at tp 1 as
    ELEMENTWISE_PASSES' factor on kept bytes gives, but 22 + 16/t sbh per rank without SP,
    where that factor gave 1.1 x (10 + 24/t); Table 4 there measures SP saving 0.5 ms of the
    22B layer's 7.7 ms forward (tp 8), which the factor put at 0.32 ms."""
    width = 2.0 if precision == "fp32" else 1.0  # parts are 16-bit bytes
    tokens, tp = np.asarray(tokens, float), np.asarray(tp, float)
    sp_div = np.where(np.asarray(sp), tp, 1.0)
    e = 2.0 * width
    kept = sum(parts[k] for k in ("norm", "gemm_in", "masks", "mlp_act", "mlp_mid")) * width
    residual = 2.0 * 3.0 * model.hidden_size * e * tokens / sp_div
    qk = (model.q_width + model.kv_heads * model.head_width) * e * tokens / tp
    rope = 2.0 * qk if model.position is PositionKind.ROPE else 0.0
    qk_norms = 2.0 * qk if model.qk_norm else 0.0  # read q and k, write them
    return 3.0 * (kept + residual + rope + qk_norms)


def fp8_cast_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Bytes an fp8 block's casts move per micro-batch, forward + backward: every FP8 GEMM casts
    its 16-bit input forward and its 16-bit output gradient backward (read 2, write 1 byte per
    element; per-tensor amax and scale: Transformer Engine, "Using FP8 with Transformer Engine";
    torchao float8 training alike); weight casts amortise over the micro-batches and are left
    out. Inputs: QKV h, output projection a*d, MLP h and f; output gradients: QKV a*d + 2kv*d,
    output projection h, MLP up (2f gated) and down h. Widths split by tp except h's."""
    h = model.hidden_size
    q, kv = model.q_width, model.kv_heads * model.head_width
    tp = np.asarray(tp, float)
    widths = 2 * h + (q + q + 2 * kv) / tp + mlp_cast_widths(model, model.ffn / tp)
    return 3.0 * widths * np.asarray(tokens, float)


def mlp_cast_widths(model: ModelSpec, f: np.ndarray | float) -> np.ndarray | float:
    """Elements per token an fp8 MLP of width `f` (per rank) casts: its up and down GEMMs'
    inputs (h, f) forward and output gradients (2f gated or f, h) backward."""
    up = 2.0 * f if model.gated_mlp else f
    return 2.0 * model.hidden_size + f + up


def attention_cast_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray,
                         cp: np.ndarray) -> np.ndarray:
    """Bytes one block's attention casts move per micro-batch, forward + backward, where a
    16-bit plan's core computes in fp32 (RuntimeTraits.attention_compute_dtype): forward casts
    Q, K, V up and the output down, backward the output gradient up and the Q, K, V gradients
    down, each reading 2 and writing 4 bytes per element or the reverse (runtime/models/layers.py
    Attention.core). Under context parallelism each of a rank's two query chunks casts the keys
    and values up to its end (context_parallel.attention): (2cp+1)/2 of the local length."""
    q, kv = model.q_width, model.kv_heads * model.head_width
    cp = np.asarray(cp, float)
    kv_tokens = np.where(cp > 1, (2.0 * cp + 1.0) / 2.0, 1.0)
    widths = (2.0 * q + 2.0 * kv * kv_tokens) / np.asarray(tp, float)
    return 2.0 * 6.0 * widths * np.asarray(tokens, float)


def torch_ring_elementwise_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray,
                                 cp: np.ndarray, kv_repeated: bool) -> dict[str, np.ndarray]:
    """Bytes the element-wise kernels around PyTorch's ring attention move per block and
    micro-batch on one rank, {"forward", "backward"}; 0 where cp is 1. Read off
    torch/distributed/tensor/experimental/_context_parallel/_attention.py (convert_to_f32 and
    the head-tail load balancer, its defaults), with q the rank's query elements (`tokens` x
    heads x head_dim / tp) and k those of K (the kv heads, or all heads where the runtime
    repeats them before SDPA, `kv_repeated`); 16-bit inputs, fp32 accumulators:
    - forward: K and V made contiguous (torchtitan hands SDPA transposed views), 8k; every
      step but the last concatenates K and V for the rotater, 8k; every step's output is cast
      to fp32 (6 bytes per element) and every step after the first merged into the running
      output (out - block_out, times the sigmoid of the log-sum-exp difference, subtracted:
      12 + 8 + 12), 38q; a step that sees only the second query half does half of that and
      re-concatenates the fp32 output (19q + 8q), so 32.5q on average; the first step's cast,
      6q, and the result's cast back to 16 bits, 6q.
    - backward: fp32 zeros for dQ, dK, dV (4q + 8k); K and V contiguous (8k); the K/V
      concatenation of every step but the last (8k); dK and dV accumulated in fp32 (+= of a
      16-bit gradient, 10 bytes per element: 20k at the first step, 23k on average after it,
      where half the steps add into one chunk and re-concatenate); the fp32 dK/dV concatenated
      for the next rank every step (16k); dQ accumulated (10q, or 13q re-concatenating: 11.5q
      on average); dQ, dK and dV cast back (6q + 12k)."""
    cp = np.asarray(cp, float)
    per_token = 1.0 / np.asarray(tp, float) * np.asarray(tokens, float)
    q = model.q_width * per_token
    k = (model.q_width if kv_repeated else model.kv_heads * model.head_width) * per_token
    forward = 8.0 * k * cp + 32.5 * q * (cp - 1.0) + 12.0 * q
    backward = (4.0 * q + 8.0 * k + 8.0 * k + 8.0 * k * (cp - 1.0) + 20.0 * k
                + 23.0 * k * (cp - 1.0) + 16.0 * k * cp + 11.5 * q * cp + 6.0 * q + 12.0 * k)
    ring = cp > 1
    return {"forward": np.where(ring, forward, 0.0), "backward": np.where(ring, backward, 0.0)}


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


def attention_core_times_s(
    model: ModelSpec, profile: ClusterProfile, peak: float, b: np.ndarray, tp: np.ndarray,
    cp: np.ndarray, act_core_bytes: np.ndarray, eager: bool, causal_skip: bool = False,
    attention_kernel: str = "fa2",
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of one block's attention core (QK^T, softmax, AV) for one
    micro-batch on one rank. Eager: batched per-head GEMMs at one head's s x d x s efficiency
    plus the softmax's passes over the kept scores (`act_core_bytes`). Fused: the kernel's
    measured share of `peak` at the length a rank attends over, half the s^2 work where it
    skips fully masked tiles (`causal_skip`)."""
    core_flops = attention_core_flops(model, b, tp, cp)
    if eager:
        # batched per-head GEMMs: efficiency of one head's s x d x s product
        per_head = core_flops / (np.asarray(b, float) * model.num_heads / np.asarray(tp, float))
        core_gemm = core_flops / (peak * profile.efficiency.matmul(per_head))
        core_fwd = core_gemm + memory_time_s(act_core_bytes * SOFTMAX_PASSES / 3.0, profile)
        core_bwd = 2.0 * core_gemm + memory_time_s(act_core_bytes * SOFTMAX_PASSES * 2 / 3, profile)
        return core_fwd, core_bwd
    work = (0.5 if causal_skip else 1.0) * core_flops
    # the kernel attends over a rank's share of each sequence (context parallelism splits it),
    # one head's width at a time
    fwd_eff, bwd_eff = attention_efficiency(profile, attention_kernel, core_flops,
                                            model.seq_len / np.asarray(cp, float),
                                            model.head_width)
    return work / (peak * fwd_eff), FLASH_BACKWARD * work / (peak * bwd_eff)


def layer_times_s(
    model: ModelSpec, profile: ClusterProfile, peak: float, b: np.ndarray, tp: np.ndarray,
    cp: np.ndarray, act_noncore_bytes: np.ndarray, act_core_bytes: np.ndarray, eager: bool,
    causal_skip: bool = False, attention_kernel: str = "fa2",
    elementwise_bytes: np.ndarray | None = None, attention_peak: float | None = None,
    extra_elementwise_bytes: np.ndarray | float = 0.0,
    host_runs_ahead: bool = False, unit_host_s: np.ndarray | float = 0.0,
    recompute_skips_last_gemm: bool = False,
) -> dict[str, np.ndarray]:
    """Forward and backward seconds of one block for one micro-batch on one rank; the host
    overhead of DTensor under tensor parallelism ("dtensor", forward + backward); and the
    extra seconds of each recompute kind: "full" (the forward again), "attention-core"
    (Megatron's selective: the attention core again), "all-but-gemms" (autoplan's runtime:
    everything but GEMMs, the attention core included), "op-sac" (torchtitan: the element-wise
    work and every second matmul). `causal_skip`: a fused causal kernel does half the s^2 work
    (FlashAttention-2, Dao 2023 §3.1: fully masked tiles are skipped).

    Each time is device work plus host work (the profile's seconds per op, per DTensor op, per
    checkpointed op and, where the host runs ahead, `unit_host_s`, the FSDP unit's hooks per
    block and micro-batch). On a CPU one core does both, so they add. `host_runs_ahead`
    (RuntimeTraits.host_runs_ahead): the host issues kernels ahead of an asynchronous device, so
    each part costs the larger of the two (`with_host`) and host costs bind only where the
    block's kernels are too small to cover them; "dtensor" is then folded into forward and
    backward and returned as 0. "<part>_device" / "<part>_host" (forward, backward, full) give
    the two apart, for device work a caller adds (MoE experts, fp8 casts).
    `recompute_skips_last_gemm`: "full" leaves out the MLP's down projection, which a
    checkpoint that stops early does not re-run (RuntimeTraits.recompute_early_stop)."""
    tokens = np.asarray(b, float) * model.seq_len / np.asarray(cp, float)
    gemm_each = [gemm_time_s(g, profile, peak, shape) for g, shape in zip(
        gemm_flops_per_layer(model, tokens, tp), gemm_shapes_per_layer(model, tokens, tp),
        strict=True)]
    gemm = sum(gemm_each)
    # a fused kernel runs at attention_peak (16-bit in an fp8 run); eager's batched GEMMs as
    # the block's other GEMMs
    core_peak = peak if eager or attention_peak is None else attention_peak
    core_fwd, core_bwd = attention_core_times_s(model, profile, core_peak, b, tp, cp,
                                                act_core_bytes, eager, causal_skip,
                                                attention_kernel)
    # the element-wise kernels' bytes, forward + backward, as the caller counted them for its
    # runtime (eager_elementwise_bytes, fused_elementwise_bytes); without a count, each kept
    # activation moved ELEMENTWISE_PASSES times
    elem = memory_time_s((act_noncore_bytes * ELEMENTWISE_PASSES if elementwise_bytes is None
                          else elementwise_bytes) + extra_elementwise_bytes, profile)
    host, dtensor = block_host_s(model, profile, tp, eager, unit_host_s, host_runs_ahead)
    parts = {
        "forward": (gemm + core_fwd + elem / 3.0, host["forward"]),
        "backward": (2.0 * gemm + core_bwd + elem * 2.0 / 3.0, host["backward"]),
        "full": (gemm - (gemm_each[3] if recompute_skips_last_gemm else 0.0) + core_fwd
                 + elem / 3.0, host["full"]),
        "all-but-gemms": (core_fwd + elem / 3.0, host["all-but-gemms"]),
        "op-sac": (op_sac_recomputed_gemm_share(model, recompute_skips_last_gemm) * gemm
                   + elem / 3.0, host["op-sac"]),
    }
    forward, backward, full, all_but_gemms, op_sac = (
        with_host(dev, issue, host_runs_ahead) for dev, issue in parts.values())
    attention_core = core_fwd + np.zeros_like(gemm)
    # the forward's non-GEMM, non-core seconds (module recompute shares them out by bytes): the
    # element-wise kernels, and on a CPU the per-op host costs beside them
    elementwise = elem / 3.0 if host_runs_ahead else forward - gemm - core_fwd
    out = {"forward": forward, "backward": backward, "dtensor": dtensor,
           "all-but-gemms": all_but_gemms, "op-sac": op_sac, "attention-core": attention_core,
           "full": full, "core_forward": core_fwd, "core_backward": core_bwd + np.zeros_like(gemm),
           "gemm_forward": gemm,
           "mlp_gemm_forward": gemm_each[2] + gemm_each[3], "elementwise_forward": elementwise,
           # the column-parallel GEMMs (QKV, the MLP's first): their weight gradients are what
           # an asynchronous input-gradient collective runs beside
           "column_gemm_forward": gemm_each[0] + gemm_each[2],
           # the row-parallel GEMMs apart (attention output projection, the MLP's second):
           # where Transformer Engine's pipelined overlap keeps SMs from them
           "proj_gemm_forward": gemm_each[1], "fc2_gemm_forward": gemm_each[3]}
    for k in ("forward", "backward", "full"):
        out[f"{k}_device"], out[f"{k}_host"] = parts[k]
    return out


def block_host_s(model: ModelSpec, profile: ClusterProfile, tp: np.ndarray, eager: bool,
                 unit_host_s: np.ndarray | float, host_runs_ahead: bool
                 ) -> tuple[dict[str, np.ndarray | float], np.ndarray]:
    """Host seconds of one block's parts for one micro-batch (layer_times_s' part names), and
    DTensor's host overhead under tensor parallelism, forward + backward.

    Every aten op costs the profile's `op_overhead_s`, every DTensor op (tp > 1)
    `dtensor_op_overhead_s`; the FSDP unit's hooks (`unit_host_s`) split between forward and
    backward like the ops. A full recompute re-issues the forward's ops and pays
    `checkpoint_op_overhead_s` for each; the partial policies re-issue the non-GEMM ops and
    pay `selective_op_overhead_s` for every forward op they inspect. Where the host runs ahead
    DTensor's overhead is part of forward and backward (returned as zero beside them)."""
    eff = profile.efficiency
    ops_f, ops_b, ops_gemm = block_ops(model, eager)
    dtensor = np.where(np.asarray(tp) > 1, (ops_f + ops_b) * eff.dtensor_op_overhead_s, 0.0)
    f_share = ops_f / (ops_f + ops_b)
    non_gemm = ops_f - ops_gemm
    hooks = ops_f * eff.selective_op_overhead_s + dtensor * non_gemm / (ops_f + ops_b)
    fwd = ops_f * eff.op_overhead_s + f_share * unit_host_s
    bwd = ops_b * eff.op_overhead_s + (1.0 - f_share) * unit_host_s
    if host_runs_ahead:
        fwd, bwd = fwd + dtensor * f_share, bwd + dtensor * (1.0 - f_share)
    partial = non_gemm * eff.op_overhead_s + hooks
    host = {"forward": fwd, "backward": bwd,
            "full": ops_f * eff.op_overhead_s + ops_f * eff.checkpoint_op_overhead_s
            + dtensor * f_share,
            "all-but-gemms": partial, "op-sac": partial}
    return host, (np.zeros_like(dtensor) if host_runs_ahead else dtensor)


def with_host(device: np.ndarray, host: np.ndarray | float, host_runs_ahead: bool
              ) -> np.ndarray:
    """Seconds of work with `device` seconds of kernels and `host` seconds of issuing them: the
    larger where the host runs ahead of an asynchronous device, their sum where one core does
    both (RuntimeTraits.host_runs_ahead)."""
    return np.maximum(device, host) if host_runs_ahead else device + host


def logits_times_s(
    model: ModelSpec, profile: ClusterProfile, peak: float, b: np.ndarray, tp: np.ndarray,
    cp: np.ndarray, vocab: np.ndarray, loss_bytes_per_logit: float,
) -> np.ndarray:
    """Forward + backward seconds of the output layer and cross-entropy per micro-batch: the
    output GEMM and its two backward GEMMs, and the loss kernels' `loss_bytes_per_logit`
    (RuntimeTraits.loss_bytes) over each rank's tokens x vocab/tp logits."""
    tokens = np.asarray(b, float) * model.seq_len / np.asarray(cp, float)
    logits = tokens * np.asarray(vocab, float) / np.asarray(tp, float)
    flops = 2.0 * logits * model.hidden_size
    shape = (tokens, np.asarray(vocab, float) / np.asarray(tp, float))
    return 3.0 * gemm_time_s(flops, profile, peak, shape) + memory_time_s(
        loss_bytes_per_logit * logits, profile)
