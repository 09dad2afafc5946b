"""Uneven layer-to-stage splits over the model's layer graph (networkx).

The model is a path graph embedding -> block_0 ... block_{L-1} -> head whose nodes carry their
forward+backward FLOPs per token; a balanced split cuts the path into contiguous stages (each with
at least one block) minimising the largest stage's FLOPs, so the stages that also hold the
embedding or the output layer (large vocabularies) get fewer blocks. Memory per stage is then
checked by the cost model (first and last stage) like any other plan.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx
import numpy as np

from autoplan.cost.compute import attention_core_flops, gemm_flops_per_layer
from autoplan.model_spec import ModelSpec


def layer_graph(model: ModelSpec) -> nx.DiGraph:
    """Path graph of the model with node attribute `flops` (fwd+bwd FLOPs per token) and
    `blocks` (transformer blocks in the node: 1 for a block, 0 for embedding and head)."""
    s = float(model.seq_len)
    one = np.array(1.0)
    gemms = gemm_flops_per_layer(model, np.array(s), one)
    block = 3.0 * (float(np.sum(gemms)) + float(attention_core_flops(model, one, one, one))) / s
    head = 3.0 * 2.0 * model.hidden_size * model.vocab_size  # logits GEMM, fwd + bwd
    embed = 3.0 * model.hidden_size  # a gather and an add: memory-bound, tiny in FLOPs
    g = nx.DiGraph()
    names = ["embedding", *(f"block_{i}" for i in range(model.num_layers)), "head"]
    for name in names:
        flops = embed if name == "embedding" else head if name == "head" else block
        g.add_node(name, flops=flops, blocks=int(name.startswith("block_")))
    nx.add_path(g, names)
    return g


def _block_weights(graph: nx.DiGraph) -> np.ndarray:
    """Cost of each block with the embedding folded into the first and the head into the last
    (they can only live with their neighbouring block's stage)."""
    order = list(nx.topological_sort(graph))
    w = [graph.nodes[n]["flops"] for n in order if graph.nodes[n]["blocks"]]
    w[0] += sum(graph.nodes[n]["flops"] for n in order[:1] if not graph.nodes[n]["blocks"])
    w[-1] += sum(graph.nodes[n]["flops"] for n in order[-1:] if not graph.nodes[n]["blocks"])
    return np.asarray(w, dtype=float)


def min_max_partition(weights: np.ndarray, stages: int) -> tuple[int, ...]:
    """Contiguous split of `weights` into `stages` non-empty parts minimising the largest part's
    sum (exact dynamic programme, vectorised over the cut position)."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    best = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n - (stages - s) + 1):
            i = np.arange(s - 1, j)
            cost = np.maximum(best[s - 1, i], prefix[j] - prefix[i])
            k = int(np.argmin(cost))
            best[s, j], cut[s, j] = cost[k], i[k]
    sizes: list[int] = []
    end = n
    for s in range(stages, 0, -1):
        start = int(cut[s, end])
        sizes.append(end - start)
        end = start
    return tuple(reversed(sizes))


@lru_cache(maxsize=256)
def balanced_layers(model: ModelSpec, stages: int) -> tuple[int, ...] | None:
    """Blocks per stage (pp * vpp stages in model order) of the FLOP-balanced split, or None when
    there are fewer blocks than stages."""
    if stages > model.num_layers:
        return None
    return min_max_partition(_block_weights(layer_graph(model)), stages)


def rank_layers(layers_per_stage: tuple[int, ...], pp: int) -> list[int]:
    """Blocks per pipeline rank: rank r holds stages r, r + pp, r + 2pp, ... (interleaving)."""
    return [sum(layers_per_stage[r::pp]) for r in range(pp)]


def split_columns(model: ModelSpec, pp: int, vpp: int) -> tuple[int, int, int] | None:
    """(layers_first, layers_max, layers_last) of the balanced split for estimate_table."""
    lps = balanced_layers(model, pp * vpp)
    if lps is None:
        return None
    per_rank = rank_layers(lps, pp)
    return per_rank[0], max(per_rank), per_rank[-1]
