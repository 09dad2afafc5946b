"""Activations per GPU: the tensors one block keeps for backward, by part, and what each
recompute policy or Megatron-Core recompute-module set keeps of them.

Source: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
sections 4-5, Table 2), generalised to grouped-query attention and SwiGLU term by term. Apart from
memory.py (states, transient backward peaks, logits, buffers) because these parts are what the
compute, element-wise and recompute-time models also price, not memory alone.
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import MlpKind, ModelSpec, NormKind


def activation_elements_per_layer(
    model: ModelSpec, b: np.ndarray, tp: np.ndarray, sp: np.ndarray, cp: np.ndarray,
    eager_attention: bool, fused_norm: bool = True, fused_swiglu: bool = True,
    kv_repeated: bool = False, attention_dropout: bool = True,
) -> dict[str, np.ndarray]:
    """Bytes one block keeps for backward per micro-batch (16-bit activations), by tensor.

    Korthikanti et al. 2022, section 4.1 (34sbh + 5as^2b for GPT), term by term so that
    grouped-query attention, gated MLPs and each runtime's kernels are exact:
      norm      each norm's saved input: 2sbh x 2 (fused LayerNorm / RMSNorm; per-row fp32
                statistics not counted); torch's composite RMSNorm off CUDA instead keeps its
                fp32 upcast input and fp32 normalised input, 8sbh per norm, fp32 in any run
                (measured with saved_tensors_hooks, autoplan.profiler.activations);
      gemm_in   the inputs of the QKV and first MLP GEMMs (the norms' outputs): 2sbh x 2;
      masks     two 1-byte dropout masks: 2sbh (none without dropout);
      branch    the attention and MLP output GEMMs' results before the residual add: 2sbh x 2
                (kept only by runtimes that must-save every GEMM output);
      qkv       Q (2sb * a*d) and K, V (2 x 2sb * kv*d), split by tp; a runtime that repeats the
                grouped K/V heads before attention (`kv_repeated`: autoplan's runtime,
                torch.repeat_interleave ahead of SDPA) keeps the repeated a-head copies;
      attn_out  the attention output, input of the output projection: 2sb * a*d;
      core      eager: softmax output 2as^2b, its dropout mask as^2b and dropout output 2as^2b
                (5as^2b; 2as^2b without dropout, or where the runtime drops only the residual
                branches: `attention_dropout`); fused attention: fp32 row statistics 4asb;
      mlp_act   the first MLP GEMM's output: 2sbf (GELU input), 4sbf for gated MLPs (gate, up);
      mlp_mid   the second MLP GEMM's input: 2sbf (GELU output, or the gate x up product), and
                an unfused SwiGLU's silu(gate) output, 2sbf more;
      qk_norm   with model.qk_norm (Qwen3), each per-head norm's saved input, q and k before
                RoPE: 2sb * (a + kv)*d fused, 8sb * (a + kv)*d for torch's composite RMSNorm
                (its fp32 upcast and normalised copies, as the block's norms), split by tp.
                Megatron-Core's `layernorm` recompute module re-runs the block's two norms,
                not these (module_kept_bytes keeps them).
    Replicated parts (norm, gemm_in, masks, branch) are split by tp only under sequence
    parallelism; the rest by tp. Context parallelism divides the sequence by cp. `input` is the
    block input full recompute keeps, 2sbh.
    """
    b, tp, cp = np.asarray(b, float), np.asarray(tp, float), np.asarray(cp, float)
    h, a, f = model.hidden_size, model.num_heads, model.ffn
    d = model.head_width
    s = model.seq_len / cp
    sbh = s * b * h
    gated = model.mlp is not MlpKind.GELU
    composite_rms = model.norm is NormKind.RMSNORM and not fused_norm
    norm = (16.0 if composite_rms else 4.0) * sbh
    if eager_attention:
        dropped = model.dropout > 0 and attention_dropout
        core = (2.0 + (3.0 if dropped else 0.0)) * a * s * model.seq_len * b
    else:
        core = 4.0 * a * s * b
    sp_div = np.where(np.asarray(sp), tp, 1.0)
    kv = a if kv_repeated else model.kv_heads
    qk_norm = (8.0 if composite_rms else 2.0) * s * b * (a + model.kv_heads) * d * float(
        model.qk_norm)
    split = {
        "qkv": 2.0 * s * b * (a * d + 2.0 * kv * d),
        "qk_norm": qk_norm,
        "attn_out": 2.0 * s * b * a * d,
        "core": core,
        "mlp_act": (4.0 if gated else 2.0) * s * b * f,
        "mlp_mid": (4.0 if gated and not fused_swiglu else 2.0) * s * b * f,
    }
    replicated = {"norm": norm, "gemm_in": 4.0 * sbh,
                  "masks": (2.0 if model.dropout > 0 else 0.0) * sbh, "branch": 4.0 * sbh}
    out = {k: v / sp_div for k, v in replicated.items()}
    out.update({k: v / tp for k, v in split.items()})
    # the composite norms' fp32 copies (fp32 in any run), and the QK-norms' share of them
    out["fp32_fixed_qk"] = (qk_norm if composite_rms else 0.0) / tp
    out["fp32_fixed"] = (norm if composite_rms else 0.0) / sp_div + out["fp32_fixed_qk"]
    out["input"] = 2.0 * sbh / sp_div
    # an h-wide 16-bit gradient of a tensor-parallel GEMM's output, whole on every tp rank
    # (weight_grad_input_bytes)
    out["h_grad"] = 2.0 * sbh + 0.0 * sp_div
    # the 16-bit softmax output alone (backward_wavefront_bytes: its gradients are this size)
    out["probs"] = (2.0 * a * s * model.seq_len * b if eager_attention else 0.0 * sbh) / tp
    out["gate_share"] = np.asarray(0.5 if gated else 1.0)
    # the Q and V projections' own outputs (op-sac keeps them): grouped K/V width, repeated or not
    out["qv_gemm"] = 2.0 * s * b * (a * d + model.kv_heads * d) / tp
    return out


NONCORE_PARTS = ("norm", "gemm_in", "masks", "qkv", "qk_norm", "attn_out", "mlp_act", "mlp_mid")
"""Activation parts (activation_elements_per_layer) the element-wise kernels move."""


def _kept_bytes_16bit(parts: dict[str, np.ndarray], policy: str) -> np.ndarray:
    """Bytes a block keeps under one recompute kind (see runtimes.SelectiveKind)."""
    core_kept = NONCORE_PARTS  # everything a block keeps but the attention core's own tensors
    if policy == "none":  # `attn_upcast`: fp32 copies of an upcast attention core
        return np.sum([parts[k] for k in (*core_kept, "core")], axis=0) + parts.get(
            "attn_upcast", 0.0)
    if policy == "attention-core":  # Megatron: re-run the core, keep the rest
        return np.sum([parts[k] for k in core_kept], axis=0)
    if policy == "all-but-gemms":  # GEMM outputs (Q, K, V, the MLP's first GEMM, branches) and
        # the block input torch.utils.checkpoint keeps for the re-run
        return parts["qkv"] + parts["mlp_act"] + parts["branch"] + parts["input"]
    if policy == "deepseek-v3":  # norms, MLA up-projections and SwiGLU's output re-run
        # (runtimes.SelectiveKind.DEEPSEEK_V3): the norm outputs (gemm_in less the routed
        # copies' dispatched inputs), Q/K/V and the SwiGLU output go; the latents stay, and
        # SwiGLU's input is kept at `fp8_scale` (0.5 in an fp8 run, as the report caches it)
        dense_in = parts["gemm_in"] - parts.get("gemm_in_routed", 0.0)
        return (parts["norm"] + parts["masks"] + parts["attn_out"] + parts["core"]
                + parts["gemm_in"] - dense_in + parts.get("mla_latent", 0.0)
                + parts["mlp_act"] * parts.get("fp8_scale", 1.0))
    if policy == "op-sac":  # SDPA outputs and every second matmul's (wq, wv, w1, w2), block input
        # (a repeated K/V copy ahead of SDPA is re-run from wv's output, not kept)
        return (parts["qv_gemm"] + parts["attn_out"] + parts["core"] + parts["mlp_act"] * parts["gate_share"]
                + parts["branch"] / 2.0 + parts["input"])
    raise ValueError(policy)


CORE_ATTN, MLP, LAYERNORM, MOE_ACT, MOE = 1, 2, 4, 8, 16
"""Bits of Recompute.modules (plan_table.RC_MODULES order)."""


def module_kept_bytes(parts: dict[str, np.ndarray], modules: np.ndarray, precision: str
                      ) -> np.ndarray:
    """Bytes a block keeps when selective recompute checkpoints the `modules` (a bit mask) and
    keeps everything else, as Megatron-Core's recompute_modules do (TransformerConfig docs,
    megatron/core/transformer/transformer_config.py):
      core_attn  normal checkpoint of the attention core: its inputs Q, K, V are kept by the
                 checkpoint, its own saved tensors (`core`: softmax and dropout, or a fused
                 kernel's row statistics) are re-made in backward;
      mlp        normal checkpoint of the dense MLP: its input (the second norm's output, half
                 of `gemm_in`, saved anyway by its first GEMM) is kept, `mlp_act` and
                 `mlp_mid` are re-made;
      layernorm  output-discarding checkpoint of both norms: each norm's input is kept (the
                 block input and the mid-block residual, 2 x `input`), the norm's own saved
                 tensors and its output (the next GEMMs' saved input, `gemm_in`) are re-made,
                 also where mlp's checkpoint saves it as its input (Megatron frees the
                 output's storage; torch's non-reentrant checkpoint saves its inputs as saved
                 tensors, which the discarding hook sees: measured, tests/unit/runtime); a MoE
                 block's routed copies of the norm output (`gemm_in_routed`, the dispatch's
                 own tensors) stay;
      moe_act    output-discarding checkpoint of the routed experts' activation: fc1's output
                 is kept, the activation's output (fc2's saved input, `mlp_mid_routed`) is
                 re-made (megatron/core/transformer/moe/experts.py);
      moe        normal checkpoint of the whole MoE layer (moe_layer.py, MoELayer.forward under
                 tensor_parallel.checkpoint): its input (the second norm's output, counted in
                 `gemm_in`) is kept; the routed copies (`gemm_in_routed`) and every expert
                 MLP tensor, routed and shared (`mlp_act`, `mlp_mid` less their dense-block
                 shares), are re-made, moe_act's among them.
    In a MoE model mlp frees the dense blocks' MLP tensors only (`mlp_*_dense`: Megatron-Core
    checkpoints no MoE block under mlp). An fp32 run doubles every 16-bit tensor;
    composite-RMSNorm fp32 copies (`fp32_fixed`) stay as they are unless layernorm re-makes
    them (the QK-norms' share, `fp32_fixed_qk`, stays either way)."""
    scale = 2.0 if precision == "fp32" else 1.0
    fixed = parts.get("fp32_fixed", 0.0) * (scale - 1.0)
    m = np.asarray(modules, dtype=np.int64)
    extra = np.where((m & MOE) > 0, 0.0, parts.get("moe_extra", 0.0))
    core, mlp, norm = (m & CORE_ATTN) > 0, (m & MLP) > 0, (m & LAYERNORM) > 0
    norm_outputs = parts["gemm_in"] - parts.get("gemm_in_routed", 0.0)
    dropped = (np.where(core, parts["core"] + parts.get("attn_upcast", 0.0), 0.0)
               + np.where(mlp, parts.get("mlp_act_dense", parts["mlp_act"])
                          + parts.get("mlp_mid_dense", parts["mlp_mid"]), 0.0)
               + np.where(norm, norm_outputs + parts["norm"] - 2.0 * parts["input"], 0.0)
               + np.where((m & MOE) > 0, moe_layer_bytes(parts),
                          np.where((m & MOE_ACT) > 0, parts.get("mlp_mid_routed", 0.0), 0.0)))
    fixed_qk = parts.get("fp32_fixed_qk", 0.0) * (scale - 1.0)
    return ((_kept_bytes_16bit(parts, "none") - dropped) * scale
            - np.where(norm, fixed_qk, fixed) + extra)


def moe_layer_bytes(parts: dict[str, np.ndarray]) -> np.ndarray:
    """16-bit bytes a mean block's MoE layers keep beyond their input (cost/moe.py,
    routed_activation_parts): the dispatched copies and the expert MLPs' tensors, routed and
    shared; 0 for a dense model, whose parts carry no MoE split."""
    return (parts.get("gemm_in_routed", 0.0)
            + parts["mlp_act"] - parts.get("mlp_act_dense", parts["mlp_act"])
            + parts["mlp_mid"] - parts.get("mlp_mid_dense", parts["mlp_mid"]))


def activation_bytes_per_layer(
    parts: dict[str, np.ndarray], recompute: np.ndarray, precision: str,
    selective: str = "attention-core", modules: np.ndarray | int = 0,
) -> np.ndarray:
    """Bytes kept per layer for recompute 0 none, 1 selective (what `selective` keeps: see
    runtimes.SelectiveKind; Megatron's is 34sbh/t for GPT with sequence parallelism; with a
    `modules` mask, module_kept_bytes), 2 full (only the layer input, 2sbh). An fp32 run
    doubles every 16-bit tensor; the fp32 ones (`fp32_fixed`) stay as they are. `moe_extra`
    (bytes, already at the run's precision: moe.eager_moe_bytes) is kept with the rest
    of a MoE layer: without recompute and under Megatron's selective, which keeps all but the
    attention core."""
    scale = 2.0 if precision == "fp32" else 1.0
    fixed = parts.get("fp32_fixed", 0.0) * (scale - 1.0)
    extra = parts.get("moe_extra", 0.0)
    full = _kept_bytes_16bit(parts, "none") * scale - fixed + extra
    keeps_norms = selective == "attention-core"  # the other kinds re-run the norms
    selective_bytes = _kept_bytes_16bit(parts, selective) * scale - (fixed if keeps_norms else 0.0)
    if keeps_norms:
        selective_bytes = selective_bytes + extra
    mods = np.asarray(modules)
    if np.any(mods > 0):
        selective_bytes = np.where(mods > 0, module_kept_bytes(parts, mods, precision),
                                   selective_bytes)
    r = np.asarray(recompute)
    return np.where(r == 0, full, np.where(r == 1, selective_bytes, parts["input"] * scale))
