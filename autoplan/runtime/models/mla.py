"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2 §2.1, eqs. 9-19, as in
DeepSeek-V3 §2.1.1): keys and values are decompressed from a low-rank latent, and a rotary key
part, shared by all heads, carries the positions.

Like layers.Attention, the module reads its local head count from tensor shapes, so the same code
runs on a tensor-parallel shard (autoplan.runtime.tensor_parallel.mla_plan); it reuses
Attention.core, so plan.attention (SDPA or eager), the recompute policies and context parallelism
see it as any attention layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.model_spec import ModelSpec
from autoplan.moe_spec import MLASpec
from autoplan.runtime.models.layers import Attention, apply_rope, rope_cos_sin


def shared_key(k_rope: torch.Tensor) -> torch.Tensor:
    """The rotary key part as a plain tensor. Under tensor parallelism it is a DTensor replicated
    over tp (wkv_a is replicated) while each rank's heads use it, so its gradient there is each
    rank's partial sum: declared Partial, DTensor sums it over tp in backward."""
    from torch.distributed.tensor import DTensor, Partial

    if isinstance(k_rope, DTensor):
        return k_rope.to_local(grad_placements=(Partial(),))
    return k_rope


class MultiHeadLatentAttention(Attention):
    """Causal MLA with DeepSeek's module names (wq or wq_a/q_norm/wq_b, wkv_a/kv_norm/wkv_b, wo):

        q        = W_UQ RMSNorm(W_DQ x)      (or W_Q x when q_lora_rank is None)  a x (d_h + d_R)
        c, k_R   = split(W_DKV x)            c: d_c (the latent), k_R: d_R (one per token)
        k_C, v   = split(W_UKV RMSNorm(c))   a x d_h and a x d_v
        k        = [k_C, RoPE(k_R)],  q = [q_C, RoPE(q_R)]  per head
        out      = W_O softmax(g q k^T / sqrt(d_h + d_R)) v

    g is 1, or with YaRN scaling YaRN's mscale^2 (Attention.softmax_gain; DeepSeek-V3: 1.874 at
    factor 40, as its reference and torchtitan's deepseek_v3 scale the softmax), and the rotary
    tables are the model's (scaled by YaRN's frequencies; rope_cos_sin).

    Every head's output of wkv_b (and of wq_b) is contiguous, so a column split keeps whole
    heads. Subclasses Attention for its attention core: Attention.__init__ sets the kernel's
    state (context_parallel, eager, ...), then its q/k/v/o projections give way to MLA's."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        del self.wq, self.wk, self.wv, self.wo
        mla = spec.mla
        assert mla is not None
        self.mla: MLASpec = mla
        h, a = spec.hidden_size, spec.num_heads  # latent norms at the model's norm_eps, as HF's
        # DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm at rms_norm_eps
        if mla.q_lora_rank is None:
            self.wq = nn.Linear(h, a * mla.qk_head_dim, bias=False)
        else:
            self.wq_a = nn.Linear(h, mla.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(mla.q_lora_rank, eps=spec.norm_eps)
            self.wq_b = nn.Linear(mla.q_lora_rank, a * mla.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(h, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(mla.kv_lora_rank, eps=spec.norm_eps)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim),
                               bias=False)
        self.wo = nn.Linear(a * mla.v_head_dim, h, bias=False)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """(b, s, h) -> (b, s, local heads * (d_h + d_R))."""
        if self.mla.q_lora_rank is None:
            return self.wq(x)
        return self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, cp = self.mla, self.context_parallel
        b, s, _ = x.shape
        q = self.queries(x).view(b, s, -1, m.qk_head_dim)  # (b, s, local heads, d_h + d_R)
        q_nope, q_rope = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        c, k_rope = self.wkv_a(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(c)).view(b, s, -1, m.qk_nope_head_dim + m.v_head_dim)
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        k_rope = shared_key(k_rope).unsqueeze(2)  # (b, s, 1, d_R): one rotary key per token
        d_r, theta, scaling = m.qk_rope_head_dim, self.rope_theta, self.rope_scaling
        cos, sin = (rope_cos_sin(s, d_r, x.device, theta, scaling) if cp is None
                    else cp.rope_cos_sin(s, d_r, x.device, theta, scaling))  # global positions
        q_rope, k_rope = apply_rope(q_rope, cos, sin), apply_rope(k_rope, cos, sin)
        heads = q.shape[2]
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, -1, heads, -1)), dim=-1)
        q, k, v = (t.transpose(1, 2) for t in one_width(q, k, v))  # (b, heads, s, width)
        out = self.core(q, k, v) if cp is None else cp.attention(q, k, v, self.core)
        out = out[..., :m.v_head_dim]  # one_width's padding of v gives zero columns here
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def one_width(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (..., d_qk) and v (..., d_v) zero-padded to one width, the attention unchanged.

    Why: torch 2.13's fused SDPA kernels need one width for q, k and v (sdp_utils.cpp: "Flash
    attention requires q,k,v to have the same last dimension"; measured on CPU: with d_v < d_qk
    SDPA falls back to its math kernel, which keeps the s x s probabilities for backward, memory
    the cost model's flash core does not hold), and context parallelism gathers K and V stacked
    in one collective. softmax(q k^T) [v, 0] = [softmax(q k^T) v, 0], so the caller slices the
    output back to d_v exactly. A v wider than q/k pads q and k instead; q is scaled by
    sqrt(d_v / d_qk) so the kernel's 1/sqrt(width) scale stays 1/sqrt(d_qk)."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if d_v < d_qk:
        return q, k, F.pad(v, (0, d_qk - d_v))
    if d_v > d_qk:
        pad = (0, d_v - d_qk)
        return F.pad(q * math.sqrt(d_v / d_qk), pad), F.pad(k, pad), v
    return q, k, v
