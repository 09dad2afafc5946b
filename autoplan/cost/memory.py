"""Memory per GPU besides the activations a block keeps (activations.py): model states under
ZeRO, the backward's transient peaks (gradients in flight, a zero-bubble step's deferred inputs,
ring attention's working set), logits, buffers and allocator overhead.

Source: model states, Rajbhandari et al. 2020 (ZeRO, section 3 and Figure 1).
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import ModelSpec

MASTER_AND_ADAM_BYTES = 12.0
"""fp32 master weights + Adam m + Adam v per parameter under mixed precision (ZeRO, 3.1: K=12)."""
FRAGMENTATION = 0.0205
"""Memory PyTorch's caching allocator strands at a training step's peak beyond what is
allocated, as a share of the allocated bytes: the median "reserved by PyTorch but unallocated"
over "allocated by PyTorch" of 30 published training OOM messages with 20 GiB or more allocated
(benchmarks/data/allocator-oom.yaml; p25 0.6%, p75 FRAGMENTATION_P75). The allocator frees its unused cached
segments before it raises, so what a message leaves is memory stuck in partly used ones. A
central estimate, as the rest of the model is, not a safety margin: a plan priced within a few
percent of the device's memory fits about as often as not. (torch.cuda.max_memory_reserved
after a run that did not fail also holds cached free segments, which the allocator gives back
when it must: it reads higher than this slack.)"""
FRAGMENTATION_P75 = 0.0516
"""The 75th percentile of the same 30 shares (numpy's linear interpolation): one training peak
in four strands more than this. A plan that fits at FRAGMENTATION but not at this share is
tight (tight_by_bytes): it may run or may not, as the allocator happens to place its blocks."""


def total_at_p75(total: np.ndarray | float, allocator: np.ndarray | float) -> np.ndarray:
    """A plan priced at `total`, its allocator slack `allocator` (FRAGMENTATION of what it
    allocates), with the slack at FRAGMENTATION_P75 instead."""
    return (np.asarray(total, float)
            + np.asarray(allocator, float) * (FRAGMENTATION_P75 / FRAGMENTATION - 1.0))


def tight_by_bytes(total: np.ndarray | float, allocator: np.ndarray | float,
                   capacity: np.ndarray | float) -> np.ndarray:
    """Bytes by which a plan that fits `capacity` at `total` would miss it at total_at_p75; 0
    where it fits either way, and 0 where it does not fit at all (that is a miss, not tight)."""
    total = np.asarray(total, float)
    return np.where(total <= capacity,
                    np.maximum(0.0, total_at_p75(total, allocator) - capacity), 0.0)


DDP_BUCKET_BYTES = 2 * 25 * 2**20
"""Two 25 MiB gradient buckets in flight (torch DDP bucket_cap_mb default)."""


GRAD_BYTES_MIXED = 4.0
"""Gradient bytes per parameter under bf16/fp16 mixed precision. Megatron-LM accumulates and
reduces gradients in an fp32 main_grad buffer (18 bytes per parameter without the distributed
optimizer, 6 + 12/d with it: Megatron-Core distributed-optimizer docs) and FSDP2 with
reduce_dtype=fp32 does the same; the ZeRO paper's K=12 accounting with 16-bit gradients (16Ψ)
is `grad_bytes=2`."""


def state_bytes_per_param(precision: str, grad_bytes: np.ndarray | float | None = None
                          ) -> tuple[float, np.ndarray | float, float]:
    """(weights, gradients, optimizer) bytes per parameter."""
    if precision == "fp32":
        return 4.0, 4.0, 8.0  # fp32 weights and grads, Adam m and v
    g = GRAD_BYTES_MIXED if grad_bytes is None else grad_bytes
    return 2.0, g, MASTER_AND_ADAM_BYTES


def model_state_bytes(
    params: np.ndarray, zero_stage: np.ndarray, shard: np.ndarray, precision: str = "bf16",
    offload_optimizer: np.ndarray | bool = False, offload_params: np.ndarray | bool = False,
    grad_bytes: np.ndarray | float | None = None, unsharded_accumulation: np.ndarray | bool = False,
    fp32_sharded_params: bool = False, fsdp2_offload: bool = False,
    sharded_grads: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Device bytes of weights, gradients and optimizer states for `params` parameters.

    ZeRO-1 shards the optimizer over `shard` ranks (2Ψ + gΨ + 12Ψ/N), ZeRO-2 also the gradients
    (2Ψ + (g+12)Ψ/N), ZeRO-3 also the weights ((2+g+12)Ψ/N) (Rajbhandari et al. 2020, Figure 1,
    with g = 2). Optimizer offload moves the optimizer and, from ZeRO-2 on, the gradient shard to
    host memory (ZeRO-Offload, Ren et al. 2021); parameter offload moves the weight shard too.
    `unsharded_accumulation`: ZeRO-2/3 under a pipeline schedule accumulate full gradients and
    keep the 16-bit weights gathered across micro-batches (torch.distributed.pipelining defers
    the reduce-scatter and resharding to the last micro-batch, as torchtitan runs FSDP + PP);
    the full gradients then stay on the device even when the optimizer is offloaded.
    `fp32_sharded_params` (FSDP2 mixed precision): the sharded parameters are the fp32 master
    weights (4Ψ/N from ZeRO-1 on), the optimizer holds Adam m and v (8Ψ/N), and the 16-bit
    compute copy is gathered: whole under ZeRO-1/2 (reshard_after_forward=False), per unit
    under ZeRO-3 (counted in the buffers).
    `fsdp2_offload` (RuntimeTraits.fsdp2_offload): parameter offload moves the gradients and the
    optimizer too, optimizer-only offload leaves the gradient shard on the device.
    `sharded_grads` (rows.Rows.sharded_grads), where given, says which rows keep only the
    gradient shard in place of ZeRO >= 2 without unsharded accumulation.
    """
    w, g, o = state_bytes_per_param(precision, grad_bytes)
    params, z, n = np.asarray(params, float), np.asarray(zero_stage), np.asarray(shard)
    acc = np.asarray(unsharded_accumulation)
    sharded = (z >= 2) & ~acc if sharded_grads is None else np.asarray(sharded_grads)
    grads = params * g / np.where(sharded, n, 1)
    optim = params * o / np.where(z >= 1, n, 1)
    if fp32_sharded_params and precision != "fp32":
        master = params * 4.0 / np.where(z >= 1, n, 1)
        weights = master + np.where((z >= 3) & ~acc, 0.0, params * w)
        optim = optim * (o - 4.0) / o
    else:
        weights = params * w / np.where((z >= 3) & ~acc, n, 1)
    off_o, off_p = np.asarray(offload_optimizer), np.asarray(offload_params)
    return {
        "params": np.where(off_p, 0.0, weights),
        "grads": np.where(off_p, 0.0, grads) if fsdp2_offload
        else np.where(off_o & (z >= 2) & ~acc, 0.0, grads),
        "optimizer": np.where(off_o | (off_p & fsdp2_offload), 0.0, optim),
    }


def host_state_bytes(
    params: np.ndarray, shard: np.ndarray, precision: str,
    offload_optimizer: np.ndarray, offload_params: np.ndarray, fsdp2_offload: bool = False,
) -> np.ndarray:
    """Host bytes one GPU's offloaded states take: optimizer + fp32 grad shard, weight shard;
    under FSDP2's parameter offload the fp32 parameter and gradient shards and the optimizer
    state (4 + 4 + 8 bytes, mixed precision)."""
    w, _, o = state_bytes_per_param(precision)
    shard_params = np.asarray(params, float) / np.asarray(shard)
    # the optimizer's own fp32 copy and gradient beside Adam's m and v: 16 bytes either way
    # (mixed precision's o already holds the master copy)
    zero_offload = (np.where(offload_optimizer, shard_params * (16.0 if precision == "fp32"
                                                                else o + 4.0), 0.0)
                    + np.where(offload_params, shard_params * w, 0.0))
    if not fsdp2_offload:
        return zero_offload
    fsdp2_params = shard_params * (o + 4.0 if precision != "fp32" else 16.0)
    return np.where(offload_params, fsdp2_params, zero_offload)


def backward_wavefront_bytes(parts: dict[str, np.ndarray], eager_attention: np.ndarray | bool,
                             precision: str, core_backward: np.ndarray | float = 0.0
                             ) -> np.ndarray:
    """Bytes one block's backward holds beyond the saved activations it has not yet freed: the
    gradients in flight at the widest point, net of the saved tensors already released.

    Measured on the runtime's blocks (autoplan.profiler.activations.backward_peak_bytes;
    tests/unit/profiler/test_activations.py): from the allocator's events over forward and
    backward of a stack of N blocks, the peak in backward sits N x kept + W + (a_none - kept)
    above the parameters and their gradients, for no and full recompute alike (a recomputed
    block's re-made tensors are all alive when its backward starts), W within 12% for GPT and
    Llama blocks with fused and eager attention in fp32. Not modelled, measured at those
    shapes: autoplan's selective (torch's selective checkpoint) held up to 1.5 W; in bf16 on
    a CPU, whose fused core computes in fp32, its fp32 q, k, v gradients and the kernel's
    buffers up to 1.8 W (eager bf16: within 18%). W is the larger of
      MLP       the gradient of the first MLP GEMM's output while the second's input gradient
                is alive: mlp_act's width (f, 2f gated), plus the h-wide gradient entering the
                block (2sbh, `input`'s size);
      attention with an eager core only: the gradients of the softmax output and of the
                scores (2 x `probs`) with the MLP's and the output projection's saved tensors
                already freed (mlp_act, mlp_mid, attn_out, the second norm's input and output
                and its dropout mask), plus two h-wide gradients (the one entering the block
                and the residual's sum).
    A fused (flash) core's dq, dk, dv are narrower than what the MLP has freed by then, unless
    its backward holds more of its own (`core_backward`, bytes: PyTorch's ring attention,
    torch_ring_attention_bytes), counted as the eager core's gradients are. Weight
    gradients are not counted here (parameters' gradients are a state; Megatron accumulates
    them in place)."""
    scale = 2.0 if precision == "fp32" else 1.0
    # the block norms' fp32 copies (fp32 in any run: not doubled)
    fixed = (parts.get("fp32_fixed", 0.0) - parts.get("fp32_fixed_qk", 0.0)) * (scale - 1.0)
    mlp = (parts["mlp_act"] + parts["input"]) * scale
    freed = (parts["mlp_act"] + parts["mlp_mid"] + parts["attn_out"]
             + 0.5 * (parts["norm"] + parts["gemm_in"] + parts["masks"])) * scale - 0.5 * fixed
    attention = (2.0 * parts["probs"] + 2.0 * parts["input"]) * scale - freed
    ring = np.asarray(core_backward, float) + 2.0 * parts["input"] * scale - freed
    widest = np.where(np.asarray(eager_attention), np.maximum(mlp, attention), mlp)
    return np.where(np.asarray(core_backward) > 0, np.maximum(widest, ring), widest)


def weight_grad_input_bytes(parts: dict[str, np.ndarray]) -> np.ndarray:
    """16-bit bytes per block and micro-batch of the gradients a zero-bubble step I captures
    for its deferred W (pipeline.DeferredWeightGrads): torch's stage_backward_input registers a
    prehook on every node whose gradient a weight's needs (get_param_groups' intermediates,
    torch/distributed/pipelining/_backward.py) and keeps what enters it until
    stage_backward_weight: the output gradient of each weight's op. Per block: the QKV
    projection's (Q and the grouped K, V widths: 2 qv_gemm - attn_out), the first MLP GEMM's
    (mlp_act, the routed copies' in a MoE block), the output projection's and the second MLP
    GEMM's (h-wide, whole on a tensor-parallel rank: 2 h_grad) and the two norms' (gemm_in,
    whose routed copies stand for the experts' second GEMM outputs). Measured on the runtime's
    blocks: 5.25 MiB against 5.50 counted for two GPT blocks (h 512, s 256; the top block's
    second h-wide gradient is the stage's incoming one: tests/unit/cost/test_memory_review.py)."""
    return (2.0 * parts["qv_gemm"] - parts["attn_out"] + parts["mlp_act"] + parts["gemm_in"]
            + 2.0 * parts["h_grad"])


RING_FORWARD_OUTPUTS = 8.0
"""PyTorch ring attention's forward working set beside the gathered K/V, in 16-bit attention
outputs: _SDPAMerger (convert_to_f32, the default) holds its fp32 running output while a step
merges the next block's output (its 16-bit result and fp32 upcast, out - block_out and the
sigmoid-weighted product): 4 fp32 outputs and one 16-bit, less the output the block keeps.
Measured 9.1 outputs from the start of the call, its own output among them, at cp 2-8 and
1-4 query heads per K/V head (tests/unit/cost/test_memory_review.py)."""
RING_BACKWARD_QUERIES, RING_BACKWARD_KV = 6.7, 8.5
"""Its backward's working set beside the gathered K/V, in 16-bit local queries and local K+V:
fp32 grad_query (2 Q), fp32 grad_key/grad_value and the fp32 next_grad_kv concatenation the
all-to-all rotater sends and receives (2 L each), each step's 16-bit dq, dk, dv and the flash
kernel's own fp32 dq accumulator, the per-step K/V concatenation (L) and the final casts.
The fit of the measured peaks, dq, dk, dv included (Q/L 0.5, 1, 2; within 0.05 L)."""


def torch_ring_attention_bytes(parts: dict[str, np.ndarray], cp: np.ndarray,
                               precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) bytes one block's attention call holds beyond its kept tensors
    under PyTorch's ring context parallelism with the all-gather rotate method (torchtitan's
    default; torch/distributed/tensor/experimental/_context_parallel/_attention.py,
    _templated_ring_attention and _templated_ring_attention_backward): each gathers the whole
    sequence's K and V once (_AllGatherRotater: cp x the local K+V, as SDPA sees them, so
    repeated heads where the runtime repeats them) and keeps it for the call, beside
    RING_FORWARD_OUTPUTS and RING_BACKWARD_* of their own. Measured with torch 2.13 on one
    process per rank, the collectives allocating their outputs only, as NCCL's do
    (tests/unit/cost/test_memory_review.py). 0 without context parallelism."""
    scale = 2.0 if precision == "fp32" else 1.0
    q = parts["attn_out"]  # the local queries are as wide as the attention output
    kv = parts["qkv"] - q
    cp = np.asarray(cp, float)
    gathered = cp * kv
    forward = (gathered + RING_FORWARD_OUTPUTS * q) * scale
    backward = (gathered + RING_BACKWARD_QUERIES * q + RING_BACKWARD_KV * kv) * scale
    return np.where(cp > 1, forward, 0.0), np.where(cp > 1, backward, 0.0)


LOGIT_BYTES_SAVED = 4.0
"""fp32 log-softmax the cross-entropy keeps for backward, per logit, per micro-batch in flight."""
LOGIT_BYTES_TRANSIENT = 8.0
"""What torch's F.cross_entropy on upcast logits holds beyond that at its peak, per logit: in
backward, nll_loss_backward's dense fp32 gradient and log_softmax_backward's fp32 result beside
the saved log-softmax (12 in all); its forward holds the 16-bit logits, their fp32 upcast and
the new log-softmax (10). Measured with the allocator's events (runtimes.RuntimeTraits.
logit_bytes_transient)."""


def logit_elements(model: ModelSpec, b: np.ndarray, tp: np.ndarray, vocab: np.ndarray,
                   cp: np.ndarray) -> np.ndarray:
    """Logits of one micro-batch on one GPU: its tokens times the vocabulary split by tp."""
    return model.seq_len / np.asarray(cp) * np.asarray(b) * vocab / np.asarray(tp)


def logits_bytes(model: ModelSpec, b: np.ndarray, tp: np.ndarray, vocab: np.ndarray,
                 cp: np.ndarray, in_flight: np.ndarray | float = 1.0,
                 saved: float = LOGIT_BYTES_SAVED, transient: float = LOGIT_BYTES_TRANSIENT
                 ) -> np.ndarray:
    """Output layer memory of the stage that computes the loss at the loss's peak: the saved
    fp32 softmax of every micro-batch whose backward has not run yet (all of them under GPipe)
    plus what the loss of the one at it holds beyond its own (`transient`); the vocabulary is
    split by tp. `saved` and `transient` bytes per logit come from the runtime's loss kernel
    (runtimes.RuntimeTraits)."""
    per_logit = saved * np.asarray(in_flight, float) + transient
    return per_logit * logit_elements(model, b, tp, vocab, cp)


DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed ZeRO-2's contiguous-gradients buffer: reduce_bucket_size elements (default 5e8,
deepspeed/runtime/zero/config.py) of the model's 16-bit dtype, which
stage_1_and_2.py setup_buckets allocates before the first gradient when contiguous_gradients
is on (its default; a second one with overlap_comm, off by default below ZeRO-3); the gradient
dtype of stage 2 (_gradient_reduction_buffer_dtype: no separate accumulation attribute when
gradients are partitioned). autoplan's export (export/deepspeed.py) sets neither key."""
