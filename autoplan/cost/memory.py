"""Memory per GPU: model states under ZeRO, activations under recompute and sequence
parallelism, logits, buffers and allocator overhead.

Sources: model states, Rajbhandari et al. 2020 (ZeRO, section 3 and Figure 1); activations,
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
sections 4-5, Table 2), generalised to grouped-query attention and SwiGLU term by term.
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import MlpKind, ModelSpec, NormKind

MASTER_AND_ADAM_BYTES = 12.0
"""fp32 master weights + Adam m + Adam v per parameter under mixed precision (ZeRO, 3.1: K=12)."""
FRAGMENTATION = 0.10
"""PyTorch's caching allocator loses ~5-15% of dynamic memory to fragmentation; we count 10% of
activations and buffers so a plan that the model says fits does fit."""
DDP_BUCKET_BYTES = 2 * 25 * 2**20
"""Two 25 MiB gradient buckets in flight (torch DDP bucket_cap_mb default)."""


GRAD_BYTES_MIXED = 4.0
"""Gradient bytes per parameter under bf16/fp16 mixed precision. Megatron-LM accumulates and
reduces gradients in an fp32 main_grad buffer (18 bytes per parameter without the distributed
optimizer, 6 + 12/d with it: Megatron-Core distributed-optimizer docs) and FSDP2 with
reduce_dtype=fp32 does the same; the ZeRO paper's K=12 accounting with 16-bit gradients (16Ψ)
is `grad_bytes=2`."""


def state_bytes_per_param(precision: str, grad_bytes: float | None = None
                          ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter."""
    if precision == "fp32":
        return 4.0, 4.0, 8.0  # fp32 weights and grads, Adam m and v
    g = GRAD_BYTES_MIXED if grad_bytes is None else grad_bytes
    return 2.0, g, MASTER_AND_ADAM_BYTES


def model_state_bytes(
    params: np.ndarray, zero_stage: np.ndarray, shard: np.ndarray, precision: str = "bf16",
    offload_optimizer: np.ndarray | bool = False, offload_params: np.ndarray | bool = False,
    grad_bytes: float | None = None, unsharded_accumulation: np.ndarray | bool = False,
) -> dict[str, np.ndarray]:
    """Device bytes of weights, gradients and optimizer states for `params` parameters.

    ZeRO-1 shards the optimizer over `shard` ranks (2Ψ + gΨ + 12Ψ/N), ZeRO-2 also the gradients
    (2Ψ + (g+12)Ψ/N), ZeRO-3 also the weights ((2+g+12)Ψ/N) (Rajbhandari et al. 2020, Figure 1,
    with g = 2). Optimizer offload moves the optimizer and, from ZeRO-2 on, the gradient shard to
    host memory (ZeRO-Offload, Ren et al. 2021); parameter offload moves the weight shard too.
    `unsharded_accumulation`: ZeRO-2/3 under a pipeline schedule accumulate full gradients and
    keep the 16-bit weights gathered across micro-batches (torch.distributed.pipelining defers
    the reduce-scatter and resharding to the last micro-batch, as torchtitan runs FSDP + PP).
    """
    w, g, o = state_bytes_per_param(precision, grad_bytes)
    params, z, n = np.asarray(params, float), np.asarray(zero_stage), np.asarray(shard)
    acc = np.asarray(unsharded_accumulation)
    weights = params * w / np.where((z >= 3) & ~acc, n, 1)
    grads = params * g / np.where((z >= 2) & ~acc, n, 1)
    optim = params * o / np.where(z >= 1, n, 1)
    off_o, off_p = np.asarray(offload_optimizer), np.asarray(offload_params)
    return {
        "params": np.where(off_p, 0.0, weights),
        "grads": np.where(off_o & (z >= 2), 0.0, grads),
        "optimizer": np.where(off_o, 0.0, optim),
    }


def host_state_bytes(
    params: np.ndarray, shard: np.ndarray, precision: str,
    offload_optimizer: np.ndarray, offload_params: np.ndarray,
) -> np.ndarray:
    """Host bytes one GPU's offloaded states take: optimizer + fp32 grad shard, weight shard."""
    w, _, o = state_bytes_per_param(precision)
    shard_params = np.asarray(params, float) / np.asarray(shard)
    return (np.where(offload_optimizer, shard_params * (o + 4.0), 0.0)
            + np.where(offload_params, shard_params * w, 0.0))


def activation_elements_per_layer(
    model: ModelSpec, b: np.ndarray, tp: np.ndarray, sp: np.ndarray, cp: np.ndarray,
    eager_attention: bool,
) -> dict[str, np.ndarray]:
    """Activation bytes one block keeps for backward, per micro-batch, in three parts.

    Korthikanti et al. 2022, section 4.1, with 16-bit activations and 1-byte dropout masks:
      replicated (not split by tp unless sequence parallel): norm inputs 4sbh, QKV and MLP inputs
        4sbh, two dropout masks 2sbh -> 10sbh for GPT;
      split by tp: Q 2sbh, K and V 4sb*kv*d, attention output 2sbh, MLP inner 4sbf (GELU input
        and output) or 8sbf (SwiGLU gate, up, product) -> 24sbh for GPT with f = 4h;
      attention core, split by tp: softmax output 2as^2b, dropout mask as^2b and output 2as^2b
        -> 5as^2b (eager attention); fused attention keeps only fp32 row statistics, 4asb.
    Returns bytes for 16-bit activations; context parallelism divides the sequence by cp.
    `replicated_fp32` is the share of `replicated` that is fp32 even in a 16-bit run (RMSNorm's
    temporaries), so it does not double in an fp32 run (see activation_bytes_per_layer).
    """
    b, tp, cp = np.asarray(b, float), np.asarray(tp, float), np.asarray(cp, float)
    h, a, f = model.hidden_size, model.num_heads, model.ffn
    s = model.seq_len / cp
    sbh = s * b * h
    masks = 2.0 if model.dropout > 0 else 0.0
    # LayerNorm's fused kernel keeps its 16-bit input (and per-row statistics, not counted).
    # torch's RMSNorm off CUDA is composite (rms_norm_composite, torch 2.13): per norm it keeps
    # its input upcast to fp32 (4sbh) and the fp32 normalised input (4sbh) instead of the
    # 16-bit input, in bf16 and fp32 runs alike (measured with saved_tensors_hooks by
    # autoplan.profiler.activations). On CUDA, _fused_rms_norm keeps the input and fp32 row
    # statistics as LayerNorm does; counting the composite form there is conservative.
    rms = model.norm is NormKind.RMSNORM
    norm_fp32 = 16.0 * sbh if rms else 0.0
    replicated = sbh * ((4.0 if rms else 8.0) + masks) + norm_fp32
    kv = 2.0 * 2.0 * s * b * model.kv_heads * model.head_dim
    inner = (8.0 if model.mlp is MlpKind.SWIGLU else 4.0) * s * b * f
    split = 2.0 * sbh + kv + 2.0 * sbh + inner
    if eager_attention:
        core = (2.0 + (3.0 if model.dropout > 0 else 0.0)) * a * s * model.seq_len * b
    else:
        core = 4.0 * a * s * b
    sp_div = np.where(np.asarray(sp), tp, 1.0)
    return {
        "replicated": replicated / sp_div,
        "replicated_fp32": norm_fp32 / sp_div,
        "split": split / tp,
        "core": core / tp,
        "input": 2.0 * sbh / sp_div,
    }


def activation_bytes_per_layer(
    parts: dict[str, np.ndarray], recompute: np.ndarray, precision: str,
) -> np.ndarray:
    """Bytes kept per layer for recompute 0 none (all parts), 1 selective (no attention core:
    34sbh/t with sequence parallelism), 2 full (only the layer input, 2sbh). An fp32 run doubles
    every 16-bit tensor; the fp32 ones (`replicated_fp32`) stay as they are."""
    scale = 2.0 if precision == "fp32" else 1.0
    fixed = parts.get("replicated_fp32", 0.0) * (scale - 1.0)
    full = (parts["replicated"] + parts["split"] + parts["core"]) * scale - fixed
    selective = (parts["replicated"] + parts["split"]) * scale - fixed
    r = np.asarray(recompute)
    return np.where(r == 0, full, np.where(r == 1, selective, parts["input"] * scale))


LOGIT_BYTES_SAVED = 4.0
"""fp32 log-softmax the cross-entropy keeps for backward, per logit, per micro-batch in flight."""
LOGIT_BYTES_TRANSIENT = 6.0
"""16-bit logits and the fp32 gradient of the micro-batch at the loss, per logit."""


def logits_bytes(model: ModelSpec, b: np.ndarray, tp: np.ndarray, vocab: np.ndarray,
                 cp: np.ndarray, in_flight: np.ndarray | float = 1.0) -> np.ndarray:
    """Output layer memory of the stage that computes the loss: the saved fp32 log-softmax of
    every micro-batch whose backward has not run yet (all of them under GPipe) plus one
    micro-batch's 16-bit logits and fp32 gradient; the vocabulary is split by tp."""
    per_logit = LOGIT_BYTES_SAVED * np.asarray(in_flight, float) + LOGIT_BYTES_TRANSIENT
    return per_logit * model.seq_len / np.asarray(cp) * np.asarray(b) * vocab / np.asarray(tp)
