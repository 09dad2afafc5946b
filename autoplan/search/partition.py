"""Uneven layer-to-stage splits over the model's layer graph (networkx).

The model is a path graph embedding -> block_0 ... block_{L-1} -> head whose nodes carry their
forward+backward FLOPs per token; a balanced split cuts the path into contiguous stages (each with
at least one block) minimising the largest stage's FLOPs, so the stages that also hold the
embedding or the output layer (large vocabularies) get fewer blocks. Memory per stage is then
checked by the cost model (first and last stage) like any other plan. The "ends" split is
the practitioners' rule of thumb: first and last stage one block lighter.
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


def ends_lighter_layers(num_layers: int, stages: int) -> tuple[int, ...] | None:
    """Blocks per stage with the first and the last stage one block lighter than the middle
    ones (they also hold the embedding and the loss: Megatron-Core's account-for-embedding/
    loss-in-pipeline-split): ends m - 1, middles m, the remainder r < stages - 2 as one more
    block on r middle stages spread evenly. None with fewer than three stages, or when no m
    fits (an empty end, or a remainder too large)."""
    if stages < 3:
        return None
    m = (num_layers + 2) // stages
    r = num_layers - (stages * m - 2)
    if m < 2 or not 0 <= r < stages - 2:
        return None
    sizes = [m - 1] + [m] * (stages - 2) + [m - 1]
    for k in range(r):  # spread the remainder over the middle stages
        sizes[1 + (k * (stages - 2)) // r] += 1
    return tuple(sizes)


def stage_layers(model: ModelSpec, pp: int, vpp: int, split: str) -> tuple[int, ...] | None:
    """Blocks per stage (pp * vpp stages in model order) of a non-even split ("balanced" or
    "ends"), or None when that split cannot cut the model into so many stages."""
    stages = pp * vpp
    if split == "balanced":
        return balanced_layers(model, stages)
    if split == "ends":
        return ends_lighter_layers(model.num_layers, stages)
    raise ValueError(f"no uneven split named {split!r}")


def rank_stages(pp: int, vpp: int, zero_bubble: bool) -> list[list[int]]:
    """Stages of each pipeline rank, as plan_table.stages_of_rank places them: round-robin
    r, r + pp, ... (Megatron's interleaving), or r and 2pp - 1 - r under ZB-V (zero-bubble with
    two chunks). tests/search/test_layouts.py holds the two against each other."""
    if zero_bubble and vpp == 2:
        return [[r, 2 * pp - 1 - r] for r in range(pp)]
    return [[r + c * pp for c in range(vpp)] for r in range(pp)]


def rank_layers(layers_per_stage: tuple[int, ...], pp: int, vpp: int = 0,
                zero_bubble: bool = False) -> list[int]:
    """Blocks per pipeline rank (all its chunks)."""
    vpp = vpp or len(layers_per_stage) // pp
    return [sum(layers_per_stage[s] for s in ss) for ss in rank_stages(pp, vpp, zero_bubble)]


def columns_of(lps: tuple[int, ...], pp: int, vpp: int,
               zero_bubble: bool = False) -> tuple[int, int, int]:
    """(layers_first, layers_max, layers_last) of a split: the cost model's columns."""
    per_rank = rank_layers(lps, pp, vpp, zero_bubble)
    return per_rank[0], max(per_rank), per_rank[-1]


def heaviest_rank_flops(model: ModelSpec, lps: tuple[int, ...], pp: int, vpp: int,
                        zero_bubble: bool = False) -> float:
    """FLOPs per token of the most loaded pipeline rank (embedding on stage 0, head on the last
    stage), the quantity the balanced split minimises."""
    w = _block_weights(layer_graph(model))
    bounds = np.concatenate([[0], np.cumsum(lps)])
    stage = [float(w[bounds[k]:bounds[k + 1]].sum()) for k in range(len(lps))]
    return max(sum(stage[s] for s in ss) for ss in rank_stages(pp, vpp, zero_bubble))


def split_columns(model: ModelSpec, pp: int, vpp: int, split: str = "balanced",
                  zero_bubble: bool = False) -> tuple[int, int, int] | None:
    """(layers_first, layers_max, layers_last) of an uneven split for estimate_table."""
    lps = stage_layers(model, pp, vpp, split)
    return None if lps is None else columns_of(lps, pp, vpp, zero_bubble)
