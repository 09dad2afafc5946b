"""Recompute time by kind: what re-running a block's parts costs per block and micro-batch
(Megatron-Core's recompute modules, DeepSeek-V3's recompute) and the FLOPs recompute adds per
step (for HFU). step_time.py charges them on the critical stage."""

from __future__ import annotations

import numpy as np

from autoplan.cost import activations, compute, latent_attention, moe
from autoplan.cost.rows import Rows, recomputed_layers
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.plan_table import RC_FULL, RC_SELECTIVE


def _elementwise(lt: dict[str, np.ndarray], parts: dict[str, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(a block's non-GEMM, non-core forward seconds, the bytes its element-wise kernels move:
    activations.NONCORE_PARTS, at least 1): a re-run part's share of that time follows its bytes."""
    elementwise = np.maximum(lt["elementwise_forward"], 0.0)
    return elementwise, np.maximum(
        np.sum([parts[k] for k in activations.NONCORE_PARTS], axis=0), 1.0)


def deepseek_v3_recompute_s(model: ModelSpec, profile: ClusterProfile, peak: float, r: Rows,
                            lt: dict[str, np.ndarray], parts: dict[str, np.ndarray]
                            ) -> np.ndarray:
    """Seconds per block DeepSeek-V3's recompute adds (runtimes.SelectiveKind.DEEPSEEK_V3):
    the norms' and SwiGLU's share of the block's element-wise forward time, in proportion to
    the bytes they keep as module_recompute_s counts them, and MLA's two up-projection GEMMs
    (latent_attention.mla_up_forward_s). The routed copies' dispatched inputs (gemm_in_routed)
    stay kept and are not re-made: out of the share. `lt`: the block's times before the MoE/MLA
    delta."""
    elementwise, noncore = _elementwise(lt, parts)
    norm_outputs = parts["gemm_in"] - parts.get("gemm_in_routed", 0.0)
    share = (parts["norm"] + norm_outputs + parts["mlp_act"] + parts["mlp_mid"]) / noncore
    return share * elementwise + latent_attention.mla_up_forward_s(model, profile, peak, r)


def module_recompute_s(lt: dict[str, np.ndarray], parts: dict[str, np.ndarray],
                       modules: np.ndarray, moe_gemm_forward: np.ndarray | float = 0.0
                       ) -> np.ndarray:
    """Seconds per block that recomputing `modules` (activations.CORE_ATTN | MLP | LAYERNORM |
    MOE_ACT | MOE) adds: the attention core's forward; the dense MLP's two GEMMs (on the dense
    share of a MoE model's blocks); the MoE layers' forward GEMMs, router and shared experts
    (`moe_gemm_forward`, the mean block's: step_time.py); and for the MLP, the norms, the
    experts' activation and the MoE layer a share of the block's non-GEMM forward time
    (element-wise work and per-op host costs) in proportion to the bytes they keep (an
    assumption: element-wise time follows bytes moved). The norms' share leaves out a MoE
    block's routed copies of their output (the dispatch's tensors); the MoE layer's share is
    those copies and every expert tensor (activations.moe_layer_bytes), the activation among them,
    so moe_act adds nothing beside moe. The all-to-alls moe repeats are step_time.py's."""
    m = np.asarray(modules, dtype=np.int64)
    elementwise, noncore = _elementwise(lt, parts)
    dense = parts.get("dense_share", 1.0)
    mlp_share = (parts.get("mlp_act_dense", parts["mlp_act"])
                 + parts.get("mlp_mid_dense", parts["mlp_mid"])) / noncore
    norm_share = (parts["norm"] + parts["gemm_in"] - parts.get("gemm_in_routed", 0.0)) / noncore
    act_share = (parts.get("mlp_act_routed", 0.0) + parts.get("mlp_mid_routed", 0.0)) / noncore
    moe_layer = (m & activations.MOE) > 0
    moe_share = activations.moe_layer_bytes(parts) / noncore
    return (np.where((m & activations.CORE_ATTN) > 0, lt["attention-core"], 0.0)
            + np.where((m & activations.MLP) > 0,
                       dense * lt["mlp_gemm_forward"] + mlp_share * elementwise, 0.0)
            + np.where((m & activations.LAYERNORM) > 0, norm_share * elementwise, 0.0)
            + np.where(moe_layer, moe_gemm_forward + moe_share * elementwise,
                       np.where((m & activations.MOE_ACT) > 0, act_share * elementwise, 0.0)))


def recompute_flops_per_step(model: ModelSpec, r: Rows, runtime: RuntimeTraits) -> np.ndarray:
    """FLOPs the recompute adds per step (for HFU)."""
    one = np.array(1.0)
    early_stop = (runtime.recompute_early_stop and not runtime.reentrant_recompute
                  and model.moe is None and model.mla is None)
    fwd_layer = np.sum(compute.gemm_flops_per_layer(model, np.array(float(model.seq_len)), one))
    fwd_core = compute.attention_core_flops(model, one, one, one)
    mla_up = latent_attention.mla_up_flops(model, np.array(float(model.seq_len)), one)
    selective = {"attention-core": fwd_core, "all-but-gemms": fwd_core, "deepseek-v3": mla_up,
                 "op-sac": compute.op_sac_recomputed_gemm_share(model, early_stop) * fwd_layer
                 }[runtime.selective.value]
    gemms = compute.gemm_flops_per_layer(model, np.array(float(model.seq_len)), one)
    m = np.asarray(r.rc_modules, dtype=np.int64)
    by_module = (np.where((m & activations.CORE_ATTN) > 0, fwd_core, 0.0)
                 + np.where((m & activations.MLP) > 0,
                            (1.0 - moe.moe_share(model)) * (gemms[2] + gemms[3]), 0.0)
                 # the MoE layer's experts, counted as the MLP the layer count stands in for
                 + np.where((m & activations.MOE) > 0,
                            moe.moe_share(model) * (gemms[2] + gemms[3]), 0.0))
    selective = np.where(m > 0, by_module, selective)
    # a full recompute re-runs a block's forward: a MoE or MLA block's as the model FLOPs
    # count it (active experts, MLA's projections), not the dense block's; a checkpoint that
    # stops early leaves out the MLP's down projection (RuntimeTraits.recompute_early_stop,
    # as block_time.block_times_s prices it)
    if model.moe is not None or model.mla is not None:
        full = (moe.model_flops_per_sequence(model) / 3.0
                - 2.0 * model.seq_len * model.hidden_size * model.vocab_size) / model.num_layers
    else:
        full = fwd_layer + fwd_core - (gemms[3] if early_stop else 0.0)
    stage = np.where(r.layers_first > 0, r.layers_first, r.layers_max)  # not a 0-block stage
    frac = recomputed_layers(stage, r) / np.maximum(stage, 1)
    return r.gbs * model.num_layers * frac * np.where(
        r.recompute == RC_FULL, full, np.where(r.recompute == RC_SELECTIVE, selective, 0.0))
