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
) -> np.ndarray:
    """Exposed seconds per block and micro-batch of ring attention (Liu et al. 2023; Megatron
    context parallelism): cp - 1 hops pass each rank's K and V chunk forward, and backward
    passes K, V and their gradients (twice the bytes); each hop overlaps with the attention
    of the chunk already held, so only what exceeds the attention core's time is exposed."""
    cp = np.asarray(cp, float)
    kv = 2.0 * elem_bytes * model.seq_len / cp * np.asarray(b, float) * (
        model.kv_heads * model.head_dim) / np.asarray(tp, float)
    hop = p2p_time_s(kv, inside_node, profile)
    total = 3.0 * (cp - 1.0) * hop
    hidden = 3.0 * np.asarray(core_forward_s, float)  # forward + backward of attention
    return np.where(cp > 1, np.maximum(total - hidden, 0.0), 0.0)
