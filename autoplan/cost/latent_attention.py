"""Multi-head latent attention (DeepSeek-V2 §2.1), per rank and micro-batch: its projections'
FLOPs and seconds beside the standard q/k/v/o GEMMs compute.py prices, and the latents it keeps;
zeros for a model without MLA. moe.block_forward_delta_s adds it to a block.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import compute
from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


def _mla_gemms(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray
               ) -> list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
    """MLA's forward GEMMs (FLOPs, output shape) on one tp rank (DeepSeek-V2 §2.1): the down
    projections (h -> d_c', h -> d_c + d_R) are replicated, the up projections and the output
    are split by heads over tp (Megatron-Core MLASelfAttention)."""
    mla, h, a = model.mla, model.hidden_size, model.num_heads
    assert mla is not None
    t, tp = np.asarray(tokens, float), np.asarray(tp, float)
    heads = a / tp
    out = []
    if mla.q_lora_rank is None:
        out.append((2 * t * h * heads * mla.qk_head_dim, (t, heads * mla.qk_head_dim)))
    else:
        out.append((2 * t * h * mla.q_lora_rank + 0 * tp, (t, mla.q_lora_rank + 0 * tp)))
        out.append((2 * t * mla.q_lora_rank * heads * mla.qk_head_dim,
                    (t, heads * mla.qk_head_dim)))
    kv_down = mla.kv_lora_rank + mla.qk_rope_head_dim
    out.append((2 * t * h * kv_down + 0 * tp, (t, kv_down + 0 * tp)))
    kv_up = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out.append((2 * t * mla.kv_lora_rank * kv_up, (t, kv_up)))
    out.append((2 * t * heads * mla.v_head_dim * h, (t, h + 0 * tp)))
    return out


def mla_block_forward_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows
                        ) -> np.ndarray:
    """Forward seconds MLA's projections take over the standard q/k/v/o GEMMs compute.py
    charges for the same model (head_dim = the core's mean width, (qk + v) / 2, keeps the
    attention core's FLOPs exact)."""
    if model.mla is None:
        return np.zeros_like(r.b)
    tokens = r.b * model.seq_len / r.cp
    mla = np.sum([compute.gemm_time_s(g, profile, peak, s)
                  for g, s in _mla_gemms(model, tokens, r.tp)], axis=0)
    flops = compute.gemm_flops_per_layer(model, tokens, r.tp)[:2]
    shapes = compute.gemm_shapes_per_layer(model, tokens, r.tp)[:2]
    standard = np.sum([compute.gemm_time_s(g, profile, peak, s)
                       for g, s in zip(flops, shapes, strict=True)], axis=0)
    return np.asarray(mla - standard)


def _mla_ups(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray
             ) -> list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]:
    """_mla_gemms' up projections (query latent -> heads, key/value latent -> heads); only
    kv_up without a query latent."""
    assert model.mla is not None
    gemms = _mla_gemms(model, tokens, tp)
    return [gemms[1], gemms[3]] if model.mla.q_lora_rank is not None else [gemms[2]]


def mla_up_flops(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Forward FLOPs of MLA's up projections on one tp rank (0 without MLA): what DeepSeek-V3's
    recompute re-runs, for HFU (recompute_time.recompute_flops_per_step)."""
    if model.mla is None:
        return 0.0 * np.asarray(tokens, float)
    return np.sum([g for g, _ in _mla_ups(model, tokens, tp)], axis=0)


def mla_up_forward_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows
                     ) -> np.ndarray:
    """Forward seconds of MLA's up projections (_mla_ups), the GEMMs DeepSeek-V3's recompute
    re-runs (report §3.2.3); 0 without MLA."""
    if model.mla is None:
        return np.zeros_like(r.b)
    ups = _mla_ups(model, r.b * model.seq_len / r.cp, r.tp)
    return np.sum([compute.gemm_time_s(g, profile, peak, s) for g, s in ups], axis=0)


def mla_latent_bytes(model: ModelSpec, r: Rows) -> np.ndarray:
    """16-bit bytes per block and micro-batch of MLA's latents: the query latent (d_c') and the
    key/value latent with the shared rotary key (d_c + d_R), the down projections' outputs,
    replicated over tp like the down projections (DeepSeek-V2 §2.1); 0 without MLA. A
    recompute that re-runs the up projections keeps them in place of Q, K, V
    (runtimes.SelectiveKind.DEEPSEEK_V3). They are the RMSNorms' inputs that the recompute
    re-norms from (report §3.2.3), not a Linear's input (the normed latents, re-made, are), so
    an fp8 run keeps them 16-bit too (§3.3.3 caches Linear inputs in FP8)."""
    mla = model.mla
    if mla is None:
        return np.zeros_like(r.b)
    width = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
    return 2.0 * r.b * model.seq_len / r.cp * width / np.where(r.sp, r.tp, 1.0)
