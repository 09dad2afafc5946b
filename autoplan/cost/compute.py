"""FLOPs of a transformer, each GEMM counted on its own (Narayanan et al. 2021 eq. 3 for GPT), and
the seconds a block takes: GEMMs at their size's efficiency, memory-bound work at HBM speed, host
costs. elementwise.py counts the element-wise bytes; attention_kernels.py rates fused attention.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import attention_kernels, elementwise
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec, NormKind, PositionKind

SOFTMAX_PASSES = 5.4
"""elementwise.ELEMENTWISE_PASSES for the eager attention core (scale, mask, softmax, dropout):
9as^2b moved forward per 5as^2b kept, twice that backward."""
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
    fwd_eff, bwd_eff = attention_kernels.attention_efficiency(
        profile, attention_kernel, core_flops, model.seq_len / np.asarray(cp, float),
        model.head_width)
    return work / (peak * fwd_eff), attention_kernels.FLASH_BACKWARD * work / (peak * bwd_eff)


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
    # runtime (elementwise.eager_elementwise_bytes, fused_elementwise_bytes); without a count,
    # each kept activation moved ELEMENTWISE_PASSES times
    elem = memory_time_s((act_noncore_bytes * elementwise.ELEMENTWISE_PASSES
                          if elementwise_bytes is None else elementwise_bytes)
                         + extra_elementwise_bytes, profile)
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
    elementwise_s = elem / 3.0 if host_runs_ahead else forward - gemm - core_fwd
    out = {"forward": forward, "backward": backward, "dtensor": dtensor,
           "all-but-gemms": all_but_gemms, "op-sac": op_sac, "attention-core": attention_core,
           "full": full, "core_forward": core_fwd, "core_backward": core_bwd + np.zeros_like(gemm),
           "gemm_forward": gemm,
           "mlp_gemm_forward": gemm_each[2] + gemm_each[3], "elementwise_forward": elementwise_s,
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
