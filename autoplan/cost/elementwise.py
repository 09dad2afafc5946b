"""HBM bytes a block's element-wise kernels move (norms, activations, residuals, casts, ring
merges), counted per runtime; compute.layer_times_s turns them into seconds.
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import ModelSpec, NormKind, PositionKind

ELEMENTWISE_PASSES = 3.3
"""HBM bytes moved by norms, activation functions, bias/dropout/residual kernels per byte of
activation kept for backward: forward reads and writes each tensor about once (38sbh moved per
34sbh kept for GPT) and backward moves about twice that (inputs, saved tensors, gradients)."""
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
    activations.activation_elements_per_layer's 16-bit bytes on this rank). Forward: the 2 norms
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
