"""Communication: collective and point-to-point times on the right link tier.

Ring collectives (Patarasuk and Yuan 2009; NCCL): all-reduce moves 2(n-1)/n of the message per
rank, all-gather and reduce-scatter (n-1)/n. Ranks are placed tp innermost, then cp, dp, and pp
outermost (Megatron-LM); a group stays inside a node when stride * size <= gpus_per_node.
"""

from __future__ import annotations

import numpy as np

from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"


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


def collective_time_s(
    kind: str, nbytes: np.ndarray, size: np.ndarray, inside_node: np.ndarray,
    profile: ClusterProfile,
) -> np.ndarray:
    """Seconds for one collective of `nbytes` (the full message) over `size` ranks."""
    n = np.asarray(size, float)
    nbytes = np.asarray(nbytes, float)
    factor = 2.0 * (n - 1) / n if kind == ALL_REDUCE else (n - 1) / n
    steps = 2.0 * (n - 1) if kind == ALL_REDUCE else (n - 1)
    bw, lat = link(nbytes, inside_node, profile)
    return np.where(n > 1, steps * lat + factor * nbytes / bw, 0.0)


def p2p_time_s(nbytes: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile) -> np.ndarray:
    """Seconds to send one activation tensor to the next pipeline stage."""
    bw, lat = link(np.asarray(nbytes, float), inside_node, profile)
    return lat + np.asarray(nbytes, float) / bw


def context_parallel_time_s(
    model: ModelSpec, b: np.ndarray, tp: np.ndarray, cp: np.ndarray, elem_bytes: float,
    core_forward_s: np.ndarray, inside_node: np.ndarray, profile: ClusterProfile,
    recompute_gathers: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Exposed seconds per block and micro-batch of the runtime's all-gather context
    parallelism (autoplan/runtime/context_parallel.py; Llama 3, Dubey et al. 2024, §3.3.2).

    Forward all-gathers each rank's K and V over cp in one call (stacked; the kv heads, before
    GQA repeats them, split by tp), b * s * kv_heads * head_dim / tp elements each once
    gathered; backward reduce-scatters dK and dV, the same bytes. Attention waits for the
    gather and the K/V projections' backward for the reduce-scatter, so nothing overlaps:
    both are exposed, and `core_forward_s` (what ring attention hid its hops behind) no longer
    enters. Counted with torch.profiler on the runtime (cp = 2, 4 blocks, 4 micro-batches):
    1 all-gather and 1 reduce-scatter per block and micro-batch; full and selective recompute
    each repeat the all-gather once (`recompute_gathers` = 1 for callers that know the policy).
    """
    cp = np.asarray(cp, float)
    kv_all = 2.0 * elem_bytes * model.seq_len * np.asarray(b, float) * (
        model.kv_heads * model.head_dim) / np.asarray(tp, float)  # K and V of all s tokens
    gather = collective_time_s(ALL_GATHER, kv_all, cp, inside_node, profile)
    scatter = collective_time_s(REDUCE_SCATTER, kv_all, cp, inside_node, profile)
    return np.where(cp > 1, (1.0 + np.asarray(recompute_gathers, float)) * gather + scatter, 0.0)
