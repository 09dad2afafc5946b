"""Transformer sub-layers: attention (MHA/GQA, optional QK-norm and RoPE) and MLPs (GELU, SwiGLU,
GeGLU).

Every layer reads the number of local heads from tensor shapes, never from the spec, so the same
code runs on a full layer and on a tensor-parallel shard (heads split over tp ranks).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import CausalBias, causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes

from autoplan.model_spec import (
    YARN_ROPE_TYPE,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
    RopeScaling,
)
from autoplan.plan import Attention as AttentionKind

COMPUTE_DTYPES = {"fp32": torch.float32}
"""RuntimeTraits.attention_compute_dtype spellings as torch dtypes."""


def make_norm(spec: ModelSpec) -> nn.Module:
    """LayerNorm (weight and bias, GPT) or RMSNorm (weight only, Llama) at the model's norm_eps
    (1e-5 unless the model says otherwise: Qwen3 and DeepSeek-V3 1e-6)."""
    if spec.norm == NormKind.RMSNORM:
        return nn.RMSNorm(spec.hidden_size, eps=spec.norm_eps)
    return nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps, bias=spec.bias)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device,
                  scaling: RopeScaling | None = None) -> torch.Tensor:
    """theta^(-2i/d) for i < d/2: the angle per position of each rotated pair (Su et al. 2021,
    eq. 15; the model's rope_theta, Llama 3's 500000), then the model's scaling where it has
    one (scale_llama3, scale_yarn)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    if scaling is None:
        return inv_freq
    if scaling.rope_type == YARN_ROPE_TYPE:
        return scale_yarn(inv_freq, head_dim, theta, scaling)
    return scale_llama3(inv_freq, scaling)


def scale_llama3(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's RoPE scaling (model_spec.RopeScaling; Meta's llama-models apply_scaling):
    frequencies whose wavelength 2*pi/f is under original/high_freq_factor are kept, those over
    original/low_freq_factor divided by `factor`, and those between blended linearly by
    s = (original / wavelength - low) / (high - low): (1 - s) f / factor + s f."""
    wavelength = 2.0 * math.pi / inv_freq
    original = float(scaling.original_max_position_embeddings)
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    blend = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    # blend is 1 below original/high (kept) and 0 above original/low (divided by factor)
    return (1.0 - blend) * inv_freq / scaling.factor + blend * inv_freq


def scale_yarn(inv_freq: torch.Tensor, head_dim: int, theta: float,
               scaling: RopeScaling) -> torch.Tensor:
    """YaRN's frequencies ("NTK-by-parts", Peng et al. 2023 §3.2; model_spec.RopeScaling): pair
    i is divided by `factor` by a ramp over i from the pair that turns beta_fast times in the
    original window (kept below it) to the one that turns beta_slow times (divided past it).
    As HF transformers' _compute_yarn_parameters (find_correction_range, linear_ramp_factor,
    truncate), DeepSeek-V3's inference/model.py and torchtitan's deepseek_v3
    precompute_freqs_cis (0.2.2; 0.3.0 models/common/rope.py _yarn_inv_freq) compute it; the
    magnitude conventions are RopeScaling.attention_scaling and softmax_gain."""
    assert scaling.factor is not None and scaling.original_max_position_embeddings is not None
    assert scaling.beta_fast is not None and scaling.beta_slow is not None

    def pair_turning(rotations: float) -> float:  # the pair that turns `rotations` times
        return (head_dim * math.log(scaling.original_max_position_embeddings
                                    / (rotations * 2 * math.pi)) / (2 * math.log(theta)))

    low, high = pair_turning(scaling.beta_fast), pair_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the references: no division by zero
    pairs = torch.arange(head_dim // 2, dtype=torch.float32, device=inv_freq.device)
    ramp = ((pairs - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: divided by factor
    return inv_freq / scaling.factor * ramp + inv_freq * (1.0 - ramp)


def rope_cos_sin(seq_len: int, head_dim: int, device: torch.device, theta: float,
                 scaling: RopeScaling | None = None) -> tuple[torch.Tensor, ...]:
    """cos/sin tables of shape (seq_len, head_dim/2) at RoPE base `theta`, with `scaling`; YaRN
    multiplies both by its attention_scaling (HF's cos * attention_scaling; 1 for DeepSeek-V3,
    whose temperature is in the softmax scale: Attention.softmax_gain)."""
    inv_freq = rope_inv_freq(head_dim, theta, device, scaling)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    gain = 1.0 if scaling is None else scaling.attention_scaling
    if gain != 1.0:
        return angles.cos() * gain, angles.sin() * gain
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x: (b, s, heads, head_dim) by position angles."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)  # each (b, s, heads, head_dim/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    """Causal self-attention; GQA when num_kv_heads < num_heads (k/v heads are repeated). Heads
    are spec.head_dim wide, so q is num_heads * head_dim wide, which need not be hidden_size.
    With spec.qk_norm each head of q and of k is RMS-normalised over head_dim before RoPE,
    q_norm and k_norm holding one head_dim weight each (Qwen3: HF Qwen3Attention applies
    q_norm(q_proj(x).view(..., head_dim)) before apply_rotary_pos_emb); under tensor
    parallelism every rank keeps them whole and normalises its own heads (tensor_parallel
    block_plan: their gradients summed over tp)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.head_dim = hd
        self.rope = spec.position == PositionKind.ROPE
        self.rope_theta = spec.rope_theta
        self.rope_scaling = spec.rope_scaling
        # YaRN with mscale_all_dim (DeepSeek's MLA): the softmax scale times mscale^2
        self.softmax_gain = 1.0 if spec.rope_scaling is None else spec.rope_scaling.softmax_gain
        # q, k and v biased with every Linear (GPT) or alone (qkv_bias: Qwen2), wo only with all;
        # column-parallel under tp, their biases are split by heads as their output rows
        qkv_bias = spec.bias or spec.qkv_bias
        self.wq = nn.Linear(h, spec.num_heads * hd, bias=qkv_bias)
        self.wk = nn.Linear(h, spec.kv_heads * hd, bias=qkv_bias)
        self.wv = nn.Linear(h, spec.kv_heads * hd, bias=qkv_bias)
        self.wo = nn.Linear(spec.num_heads * hd, h, bias=spec.bias)
        if spec.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=spec.norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=spec.norm_eps)
        self.qk_norm = spec.qk_norm
        self.context_parallel = None  # context_parallel.apply_cp sets it when cp > 1
        self.eager = False  # plan.attention: set_attention() sets it for eager
        self.compute_dtype: torch.dtype | None = None  # set_attention(): the fused core's dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        cp = self.context_parallel
        q = self.wq(x).view(b, s, -1, self.head_dim)  # (b, s, local heads, hd)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.qk_norm:  # per head, over head_dim: (b, s, local heads, hd)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            cos, sin = (
                rope_cos_sin(s, self.head_dim, x.device, self.rope_theta, self.rope_scaling)
                if cp is None else
                cp.rope_cos_sin(s, self.head_dim, x.device, self.rope_theta, self.rope_scaling))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, s, hd)
        out = self.core(q, k, v) if cp is None else cp.attention(q, k, v, self.core)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(q k^T / sqrt(d)) v; GQA repeats k/v heads here. The queries are the
        last q_len positions of the keys (lower-right causal: query t sees keys up to
        t + kv_len - q_len), as context parallelism's chunks attend (context_parallel.py).
        The fused path never hands SDPA a dense mask, so CUDA runs the flash kernel for both
        (FlashAttention-2 aligns causal masks lower right, torch's CausalBias dispatches to it).
        With `compute_dtype` set (autoplan-cpu's attention_compute_dtype), q, k and v are cast
        to it for the kernel and the output back to q's dtype. YaRN's softmax_gain is the
        kernel's scale, gain / sqrt(d) (as torchtitan passes scale=; context parallelism's
        chunks run this core), not a product with q that would round q once more in bf16."""
        scale = None if self.softmax_gain == 1.0 else self.softmax_gain / math.sqrt(q.shape[-1])
        out_dtype, up = q.dtype, self.compute_dtype
        cast = up is not None and out_dtype != up
        if cast:  # before the GQA repeat: fewer bytes
            q, k, v = q.to(up), k.to(up), v.to(up)
        n_rep = q.shape[1] // k.shape[1]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=1)
            v = v.repeat_interleave(n_rep, dim=1)
        if self.eager:
            return eager_attention(q, k, v, scale)
        q_len, kv_len = q.shape[-2], k.shape[-2]
        if q_len == kv_len:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=lower_right_causal(q_len, kv_len), scale=scale)
        return out.to(out_dtype) if cast else out


@functools.lru_cache(maxsize=64)
def lower_right_causal(q_len: int, kv_len: int) -> CausalBias:
    """torch's lower-right CausalBias (no tensor: SDPA picks the kernel from it). Built with
    dispatch modes off: a CausalBias cannot be created under one (selective recompute's
    caching mode, the profiler's op counters), though it can be used there."""
    with _disable_current_modes():
        return causal_lower_right(q_len, kv_len)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """Unfused causal softmax(q k^T / sqrt(d) + mask) v (Vaswani et al. 2017, eq. 1), as
    Megatron-LM ran before FlashAttention: the (b, heads, s, s) probabilities are materialised
    and kept for backward (the 2as^2b bytes of the cost model's eager attention core). The
    queries are the keys' last q_len positions (lower-right causal, as Attention.core).
    `scale` replaces 1/sqrt(d), as SDPA's does (YaRN's softmax gain)."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (b, heads, s_q, s_k)
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return probs @ v


def set_attention(model: nn.Module, kind: AttentionKind, device_type: str | None = None) -> None:
    """plan.attention: flash runs SDPA (fused, no s x s tensors kept), eager the unfused form.
    `device_type` (the device the model will run on): the fused core computes in the dtype
    autoplan's runtime traits for that device name (cost/runtime_traits.py attention_compute_dtype:
    fp32 on CPU, where torch's bf16 flash backward is the bottleneck); None keeps q's dtype."""
    dtype = None
    if device_type is not None and kind != AttentionKind.EAGER:
        from autoplan.cost.runtimes import load_runtime

        name = load_runtime(None, on_cpu=device_type == "cpu").attention_compute_dtype
        dtype = COMPUTE_DTYPES[name] if name is not None else None
    for module in model.modules():
        if isinstance(module, Attention):
            module.eager = kind == AttentionKind.EAGER
            module.compute_dtype = dtype


class FeedForward(nn.Module):
    """GELU MLP w2(gelu(w1 x)), SwiGLU w2(silu(w1 x) * w3 x) or GeGLU w2(gelu(w1 x) * w3 x)
    (Shazeer 2020, "GLU Variants Improve Transformer"; GeGLU's GELU in tanh form, as Gemma's
    gelu_pytorch_tanh)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.swiglu = spec.mlp == MlpKind.SWIGLU
        self.geglu = spec.mlp == MlpKind.GEGLU
        self.w1 = nn.Linear(spec.hidden_size, spec.ffn, bias=spec.bias)
        self.w2 = nn.Linear(spec.ffn, spec.hidden_size, bias=spec.bias)
        if self.swiglu or self.geglu:  # tensor_parallel shards w3 like w1 (column-wise)
            self.w3 = nn.Linear(spec.hidden_size, spec.ffn, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        if self.geglu:
            return self.w2(F.gelu(self.w1(x), approximate="tanh") * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))
