"""Communication: collective and point-to-point times on the right link tier.

Ring collectives (Patarasuk and Yuan 2009; NCCL): all-reduce moves 2(n-1)/n of the message per
rank, all-gather and reduce-scatter (n-1)/n; across nodes the NICs' aggregate bounds the ring
and NCCL may run all-reduce hierarchically (collective_time_s). Ranks are placed tp innermost,
then cp, dp, and pp outermost (Megatron-LM); a group stays inside a node when
stride * size <= gpus_per_node.
A profile measured by `autoplan profile` carries seconds per call by kind, size and group
(`collectives`); inside a node those tables replace the ring formula.
"""

from __future__ import annotations

import numpy as np

from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"
SEND_RECV = "send_recv"
ALL_TO_ALL = "all_to_all"
"""Each rank sends (n-1)/n of its buffer, 1/n to every other rank (MoE token dispatch)."""


def intra_node(stride: np.ndarray, size: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Whether a group of `size` ranks `stride` apart fits inside one node."""
    return np.asarray(stride) * np.asarray(size) <= gpus_per_node


def link(nbytes: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile
         ) -> tuple[np.ndarray, np.ndarray]:
    """(achieved bytes/s, latency s) of one GPU's link for messages of `nbytes`."""
    eff = profile.efficiency
    intra_eff = eff.intra_node(nbytes) if eff.intra_node is not None else 1.0
    inter_eff = eff.inter_node(nbytes) if eff.inter_node is not None else 1.0
    bw = np.where(inside_node, profile.intra_node.bytes_per_s * intra_eff,
                  profile.inter_node.bytes_per_s * inter_eff)
    lat = np.where(inside_node, profile.intra_node.latency_s, profile.inter_node.latency_s)
    return bw, lat


def members_per_node(stride: np.ndarray, size: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Ranks of a group of `size` ranks `stride` apart that share one node (ranks are placed tp
    innermost, Megatron-LM's order): the whole group inside a node, or gpus_per_node / stride."""
    stride, size = np.asarray(stride, float), np.asarray(size, float)
    return np.clip(np.floor(gpus_per_node / np.maximum(stride, 1.0)), 1.0, size)


def collective_time_s(
    kind: str, nbytes: np.ndarray, size: np.ndarray, inside_node: np.ndarray,
    profile: ClusterProfile, per_node: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds for one collective of `nbytes` (the full message) over `size` ranks, `per_node`
    of them in each node (default: all when `inside_node`, else one).

    Inside one node: a ring over NVLink, 2(n-1)/n * M / B_intra for all-reduce, half that for
    all-gather and reduce-scatter, one latency per step.

    Across k = size/g nodes with g ranks in each, NCCL's two algorithms:
    - the ring (NCCL's only algorithm for all-gather and reduce-scatter, and one for all-reduce):
      one ring per channel through all n ranks, each channel leaving a node through its own NIC
      (g channels on g rail NICs), every hop sending at once, so the slower of one GPU's NVLink
      and the node's g NICs sets the pace: 2(n-1)/n * M / min(B_intra, g B_inter); latency per
      step as NCCL's own tuning model counts it (intra-node steps at NVLink latency, the
      2(k-1), or k-1, steps that cross nodes at the network's). That is what
      nccl-tests' bus bandwidth measures across nodes: bounded by the NICs' aggregate per GPU
      (NVIDIA/nccl-tests issues #119, #175: 4 HDR NICs per 8 A100s give 100 GB/s "theoretical",
      86-96 measured);
    - for all-reduce, the hierarchical reduction NCCL's tree stands for (Jeaugey, "Massively
      Scale Your Deep Learning Training with NCCL 2.4", 2019; Sergeev & Del Balso 2018): a ring
      inside each node, then across the nodes one per rail in which each of the g GPUs sends
      1/g of the message through its own NIC, 2(g-1)/g * M/B_intra + 2(k-1)/k * M/(g B_inter),
      with NCCL's double binary tree latency (2 log2 k hops) where it beats the ring's;
    NCCL's tuner runs all-reduce on whichever is faster for the message (the smaller time)."""
    n = np.asarray(size, float)
    nbytes = np.asarray(nbytes, float)
    g = np.where(np.asarray(inside_node), n, 1.0) if per_node is None else np.minimum(
        np.asarray(per_node, float), n)
    k = np.maximum(n / g, 1.0)
    if kind == ALL_TO_ALL:
        return _all_to_all_s(nbytes, n, g, profile)
    twice = 2.0 if kind == ALL_REDUCE else 1.0
    bw_in, lat_in = link(nbytes, np.ones_like(n, dtype=bool), profile)
    bw_out, lat_out = link(nbytes / g, np.zeros_like(n, dtype=bool), profile)
    intra = twice * ((g - 1.0) / g * nbytes / bw_in + (g - 1.0) * lat_in)
    # NCCL's tuning model (src/graph/tuning.cc, ncclTopoTuneModel): a ring's steps cost the
    # intra-node latency but for the 2(k-1) (all-reduce) or k-1 steps that cross nodes
    inter_steps = twice * (k - 1.0)
    bw_nic, _ = link(nbytes, np.zeros_like(n, dtype=bool), profile)  # nccl-tests' busbw by size
    ring = (twice * (n - 1.0) / n * nbytes / np.minimum(bw_in, g * bw_nic)
            + (twice * (n - 1.0) - inter_steps) * lat_in + inter_steps * lat_out)
    if kind == ALL_REDUCE:  # the tree's depth in latency where it is shorter than a ring's
        hops = np.minimum(inter_steps, 2.0 * np.ceil(np.log2(k)))
        hierarchical = intra + twice * (k - 1.0) / k * nbytes / (g * bw_out) + hops * lat_out
        across = np.minimum(ring, hierarchical)
    else:
        across = ring
    if kind == ALL_REDUCE:  # NCCL's tuner takes NVLS where the node has it and it is faster
        intra = np.minimum(intra, nvls_all_reduce_s(nbytes, n, profile))
    total = np.where(n > 1, np.where(k > 1, across, intra), 0.0)
    return measured_or(kind, nbytes, n, inside_node, profile, total)


NVLS_MEASURED_GROUP = 8
"""The group size the profiles' NVLS figures were measured over (one HGX/DGX node)."""


def nvls_all_reduce_s(nbytes: np.ndarray, n: np.ndarray, profile: ClusterProfile) -> np.ndarray:
    """Seconds of an NVLS all-reduce of `nbytes` over n ranks inside a node; infinite where the
    profile files no NVLS (Efficiency.nvls_all_reduce). Each GPU's link carries M + M/n each
    way (the switch pulls every GPU's slices for the reduction, then multicasts each reduced
    slice to all), so the share measured over NVLS_MEASURED_GROUP GPUs is scaled by
    (1 + 1/8) / (1 + 1/n) for a group of n."""
    curve = profile.efficiency.nvls_all_reduce
    nbytes = np.asarray(nbytes, float)
    if curve is None:
        return np.full(np.broadcast(nbytes, n).shape, np.inf)
    n = np.maximum(np.asarray(n, float), 2.0)
    share = curve(nbytes) * (1.0 + 1.0 / NVLS_MEASURED_GROUP) / (1.0 + 1.0 / n)
    return nbytes / (profile.intra_node.bytes_per_s * share)


def _all_to_all_s(nbytes: np.ndarray, n: np.ndarray, g: np.ndarray, profile: ClusterProfile
                  ) -> np.ndarray:
    """All-to-all of `nbytes` per rank over n ranks, g per node: (g-1)/n of the buffer goes over
    NVLink and (n-g)/n through the rank's own NIC, both at once (NCCL posts every peer's send
    together; DeepSeek-V3 report §3.2.2 overlaps the IB and NVLink legs), so the slower leg
    sets the time; one latency per peer node plus one inside."""
    bw_in, lat_in = link(nbytes / np.maximum(n, 1.0), np.ones_like(n, dtype=bool), profile)
    bw_out, lat_out = link(nbytes / np.maximum(n, 1.0), np.zeros_like(n, dtype=bool), profile)
    inside = (g - 1.0) / n * nbytes / bw_in + lat_in
    across = np.where(n > g, (n - g) / n * nbytes / bw_out + (n / g - 1.0) * lat_out, 0.0)
    return np.where(n > 1, np.maximum(inside, across), 0.0)


def measured_or(kind: str, nbytes: np.ndarray, size: np.ndarray, inside_node: np.ndarray,
                profile: ClusterProfile, formula: np.ndarray) -> np.ndarray:
    """`formula`, replaced by the profile's measured seconds per call where it has a table for
    this kind and group size inside a node. A table measured with more ranks than the host
    has cores already holds that time-sharing, which estimate_table applies to every part of
    the step; it is divided out here so it is not counted twice."""
    tables = profile.collectives.table(kind) if profile.collectives is not None else {}
    if not tables:
        return formula
    slots = profile.host.compute_slots
    out = np.asarray(formula, float)
    for group, table in tables.items():
        shared = max(1.0, group / slots) if slots else 1.0
        out = np.where((np.asarray(size) == group) & inside_node, table(nbytes) / shared, out)
    return out


def contention_s(hidden_s: np.ndarray | float, profile: ClusterProfile) -> np.ndarray:
    """Seconds of compute lost to collectives that run beside it for `hidden_s` seconds.

    Compute beside a running collective takes (1 + s) times as long (the profile's
    `efficiency.comm_slowdown`): NCCL runs each channel as a thread block on an SM the GEMM
    cannot use, so a GEMM sized to fill every SM in one wave spills into a second (NVIDIA
    developer forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation
    because of Tail Effect", 2025: an all-gather's 24 blocks of an H100's 132 SMs), and both
    share HBM. Lee et al. 2025 ("Characterizing Compute-Communication Overlap in
    GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114) measure compute 18.9% slower
    on average under overlap (GPT and Llama, 4 A100s or H100s). In `hidden_s` seconds of
    overlap the compute beside it does hidden_s / (1 + s) seconds of its own work; the rest,
    hidden_s * s / (1 + s), is added."""
    s = profile.efficiency.comm_slowdown
    return np.asarray(hidden_s, float) * (s / (1.0 + s))


def p2p_time_s(nbytes: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile) -> np.ndarray:
    """Seconds to send one activation tensor to the next pipeline stage."""
    nbytes = np.asarray(nbytes, float)
    bw, lat = link(nbytes, inside_node, profile)
    return measured_or(SEND_RECV, nbytes, np.full_like(nbytes, 2.0), inside_node, profile,
                       lat + nbytes / bw)


TP_CALLS: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "layer": ({ALL_REDUCE: 4}, {ALL_GATHER: 4, REDUCE_SCATTER: 4}),
    "recompute_full": ({ALL_REDUCE: 1}, {ALL_GATHER: 2, REDUCE_SCATTER: 1}),
    "recompute_reentrant": ({ALL_REDUCE: 2}, {ALL_GATHER: 2, REDUCE_SCATTER: 2}),
    "recompute_selective": ({}, {ALL_GATHER: 2}),
    "embedding": ({ALL_REDUCE: 1}, {ALL_REDUCE: 1, ALL_GATHER: 1}),
    "head": ({ALL_REDUCE: 1}, {ALL_GATHER: 1, REDUCE_SCATTER: 1}),
}
"""Tensor-parallel collectives of b*s*h activations per micro-batch, by where they occur:
(calls by kind without sequence parallelism, with it); see tensor_parallel_time_s.
tests/unit/cost/test_tp_collectives.py counts them on the runtime."""
LOSS_ALL_REDUCES = 3
"""The vocab-parallel loss's all-reduces of one float per token (max, sum of exponentials,
target logit), per micro-batch on the last stage."""


def tensor_parallel_time_s(
    model: ModelSpec, msg_bytes: np.ndarray, loss_bytes: np.ndarray, tp: np.ndarray,
    sp: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile,
    per_node: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Seconds of the tensor-parallel collectives, by where they occur (TP_CALLS).

    Each block all-reduces its attention and MLP outputs forward and their inputs' gradients
    backward (Megatron-LM, Shoeybi et al. 2019): 4 all-reduces of b*s*h. With sequence
    parallelism each becomes a reduce-scatter plus an all-gather of the same bytes
    (Korthikanti et al. 2022 §4.2.2), so the bytes match and the calls double. Counted on the
    runtime with torch.profiler (tp=2, GPT and Llama tiny models, 4 and 8 layers, 4 and 8
    micro-batches), per micro-batch unless said otherwise:
    - "layer": 4 all-reduces, or 4 all-gathers + 4 reduce-scatters, per block;
    - "recompute_full": forward collectives a full recompute repeats; non-reentrant checkpoint
      stops at the last tensor backward needs, so the block's final all-reduce (reduce-scatter)
      is not repeated: 1 all-reduce, or 2 all-gathers + 1 reduce-scatter;
    - "recompute_reentrant": the same under a reentrant checkpoint (Megatron, DeepSpeed;
      RuntimeTraits.reentrant_recompute), which re-runs the whole forward: 2 all-reduces, or
      2 all-gathers + 2 reduce-scatters;
    - "recompute_selective": selective recompute keeps the matmul and reduction outputs but
      re-gathers the sequence-parallel inputs of the two column-parallel GEMMs: 2 all-gathers;
    - "embedding" (first stage): the vocab-parallel embedding's all-reduce, and with sequence
      parallelism an all-gather of the gradient of its sequence-sharded output backward;
    - "head" (last stage): the output layer's input gradient, an all-reduce (with sequence
      parallelism an all-gather forward and a reduce-scatter backward), and the
      vocab-parallel loss (max, sum of exponentials, target logit): 3 all-reduces of one
      float per token;
    - "norm_grad": one all-reduce of a norm weight's (or bias's) gradient, h floats. With
      sequence parallelism the norms (each block's two and the final one) stay replicated but
      see sequence shards, so their gradients are partial sums; the caller counts how often
      they are summed (once per step, or per micro-batch where FSDP reduces every one).
    A profile's tp_collective_overhead_s (DTensor's host seconds per redistribute, measured on
    CPU) is added to each call TP_CALLS counts and to norm_grad's (a Partial -> Replicate
    redistribute, runtime/optim.reduce_partial_grads); the loss's all-reduces, which loss_parallel
    issues inside its op handlers rather than by a redistribute, are not charged it.
    """
    def coll(kind: str, nbytes: np.ndarray) -> np.ndarray:
        return collective_time_s(kind, nbytes, tp, inside_node, profile, per_node=per_node)

    kinds = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)
    # DTensor's host seconds per call (a runtime that pays host costs; 0 elsewhere:
    # step_time.priced_profile), charged to every call TP_CALLS counts where tp > 1
    host = np.where(np.asarray(tp) > 1, profile.efficiency.tp_collective_overhead_s, 0.0)
    each = {kind: coll(kind, msg_bytes) + host for kind in kinds}
    sp = np.asarray(sp, bool)
    out = {part: sum(np.where(sp, on.get(k, 0), off.get(k, 0)) * each[k] for k in kinds)
           for part, (off, on) in TP_CALLS.items()}
    out["head"] = out["head"] + LOSS_ALL_REDUCES * coll(ALL_REDUCE, loss_bytes)
    norm_grad = coll(ALL_REDUCE, np.full_like(np.asarray(msg_bytes, float),
                                              4.0 * model.hidden_size))
    out["norm_grad"] = np.where(sp, norm_grad + host, 0.0)
    return out


def context_parallel_time_s(
    model: ModelSpec, b: np.ndarray, tp: np.ndarray, cp: np.ndarray, elem_bytes: float,
    inside_node: np.ndarray, profile: ClusterProfile, recompute_gathers: np.ndarray | float = 0.0,
    per_node: np.ndarray | None = None,
) -> np.ndarray:
    """Exposed seconds per block and micro-batch of the runtime's all-gather context
    parallelism (autoplan/runtime/context_parallel.py; Llama 3, Dubey et al. 2024, §3.3.2).

    Forward all-gathers each rank's K and V over cp in one call (stacked; the kv heads, before
    GQA repeats them, split by tp), b * s * kv_heads * head_dim / tp elements each once
    gathered; backward reduce-scatters dK and dV, the same bytes. Attention waits for the
    gather and the K/V projections' backward for the reduce-scatter, so nothing overlaps:
    both are exposed. Counted with torch.profiler on the runtime (cp = 2, 4 blocks, 4 micro-batches):
    1 all-gather and 1 reduce-scatter per block and micro-batch; full and selective recompute
    each repeat the all-gather once (`recompute_gathers` = 1 for callers that know the policy).
    """
    cp = np.asarray(cp, float)
    kv_all = 2.0 * elem_bytes * model.seq_len * np.asarray(b, float) * (
        model.kv_heads * model.head_width) / np.asarray(tp, float)  # K and V of all s tokens
    gather = collective_time_s(ALL_GATHER, kv_all, cp, inside_node, profile, per_node=per_node)
    scatter = collective_time_s(REDUCE_SCATTER, kv_all, cp, inside_node, profile,
                                per_node=per_node)
    return np.where(cp > 1, (1.0 + np.asarray(recompute_gathers, float)) * gather + scatter, 0.0)


def torch_ring_time_s(
    kv_bytes: np.ndarray, cp: np.ndarray, step_forward_s: np.ndarray,
    step_backward_s: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile,
    per_node: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Exposed seconds per block and micro-batch of PyTorch's ring attention
    (torch.distributed.tensor.experimental context_parallel, with its defaults
    rotate_method ALL_GATHER and convert_to_f32; torchtitan's context_parallel_rotate_method
    defaults to "allgather"), by pass: {"forward", "backward"}.

    `kv_bytes`: K and V of the whole sequence as the SDPA call sees them (16-bit; torchtitan
    repeats the grouped heads before it). `step_*_s`: one ring step's attention kernel; under
    the head-tail load balancer every one of the cp steps does the same work.
    - Forward: one all-gather of K/V (the rotater gathers once, at step 0, and waits for it at
      step 1), so it hides behind the first step only.
    - Backward: the same all-gather again behind the first backward step, and the gradients
      dK, dV of each step passed to the next rank (an all-to-all permute) in fp32, 2x the 16-bit
      chunk, each waited for after the next step's kernel: cp - 1 of them hide behind a step,
      the last (after the loop) is exposed.
    """
    cp = np.asarray(cp, float)
    gather = collective_time_s(ALL_GATHER, kv_bytes, cp, inside_node, profile, per_node=per_node)
    shift = p2p_time_s(2.0 * np.asarray(kv_bytes, float) / np.maximum(cp, 1.0), inside_node,
                       profile)
    forward = np.maximum(gather - step_forward_s, 0.0)
    backward = (np.maximum(gather - step_backward_s, 0.0)
                + (cp - 1.0) * np.maximum(shift - step_backward_s, 0.0) + shift)
    ring = cp > 1
    return {"forward": np.where(ring, forward, 0.0), "backward": np.where(ring, backward, 0.0)}
