"""Uneven layer-to-stage splits over the model's layer graph (networkx).

The model is a path graph embedding -> block_0 ... block_{L-1} -> head whose nodes carry their
forward+backward FLOPs per token; a balanced split cuts the path into contiguous stages (each with
at least one block) minimising the largest stage's FLOPs, so the stages that also hold the
embedding or the output layer (large vocabularies) get fewer blocks. Memory per stage is then
checked by the cost model (first and last stage) like any other plan. The "ends" split is
the practitioners' rule of thumb: first and last stage one block lighter; "embed-loss" gives
the embedding and the loss stages of their own (no block); "deepspeed" is the split DeepSpeed's
PipelineModule makes under Megatron-DeepSpeed (partition_method type:transformer).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from autoplan.cost.compute import attention_core_flops, gemm_flops_per_layer
from autoplan.model_spec import ModelSpec

if TYPE_CHECKING:
    import networkx as nx


@lru_cache(maxsize=64)
def node_flops(model: ModelSpec) -> tuple[float, float, float]:
    """(a block's, the embedding's, the head's) forward+backward FLOPs per token: the node
    weights of layer_graph, which the splits below read as arrays along its path (the search
    then needs no graph library, 0.1 s of every `search` start)."""
    s = float(model.seq_len)
    one = np.array(1.0)
    gemms = gemm_flops_per_layer(model, np.array(s), one)
    block = 3.0 * (float(np.sum(gemms)) + float(attention_core_flops(model, one, one, one))) / s
    head = 3.0 * 2.0 * model.hidden_size * model.vocab_size  # logits GEMM, fwd + bwd
    embed = 3.0 * model.hidden_size  # a gather and an add: memory-bound, tiny in FLOPs
    return block, embed, head


def layer_graph(model: ModelSpec) -> nx.DiGraph:
    """Path graph of the model with node attribute `flops` (fwd+bwd FLOPs per token) and
    `blocks` (transformer blocks in the node: 1 for a block, 0 for embedding and head)."""
    import networkx as nx

    block, embed, head = node_flops(model)
    g = nx.DiGraph()
    names = ["embedding", *(f"block_{i}" for i in range(model.num_layers)), "head"]
    for name in names:
        flops = embed if name == "embedding" else head if name == "head" else block
        g.add_node(name, flops=flops, blocks=int(name.startswith("block_")))
    nx.add_path(g, names)
    return g


def _block_weights(model: ModelSpec) -> np.ndarray:
    """Cost of each block along layer_graph's path with the embedding folded into the first
    and the head into the last (they can only live with their neighbouring block's stage)."""
    w, embed, head = _path_flops(model)
    w = w.copy()
    w[0] += embed
    w[-1] += head
    return w


def min_max_partition(weights: np.ndarray, stages: int) -> tuple[int, ...]:
    """Contiguous split of `weights` into `stages` non-empty parts minimising the largest part's
    sum (exact dynamic programme, vectorised over the cut and the end position: one numpy pass
    per stage; ties go to the earliest cut)."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    best = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, stages + 1):
        j = np.arange(s, n - (stages - s) + 1)  # where stage s may end
        i = np.arange(s - 1, j[-1])[:, None]  # where it may start (the cut before it)
        cost = np.maximum(best[s - 1, i], prefix[j][None, :] - prefix[i])
        cost[i >= j[None, :]] = np.inf  # a stage holds at least one block
        k = np.argmin(cost, axis=0)
        best[s, j], cut[s, j] = cost[k, np.arange(len(j))], i[k, 0]
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
    return min_max_partition(_block_weights(model), stages)


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


def embed_loss_layers(num_layers: int, stages: int) -> tuple[int, ...] | None:
    """Blocks per stage with an embedding-only first stage and a last stage of only the final
    norm, output layer and loss (Megatron-Core's --pipeline-model-parallel-layout "E|t*n|...|L",
    torchtitan's module_fqns_per_model_part [["tok_embeddings"], ..., ["norm", "output"]]): the
    blocks split evenly over the stages between, the remainder one more on the first of them.
    None with fewer than three stages or fewer blocks than middle stages."""
    middle = stages - 2
    if middle < 1 or num_layers < middle:
        return None
    base, extra = divmod(num_layers, middle)
    return (0, *(base + (1 if i < extra else 0) for i in range(middle)), 0)


GPT_MODEL_PIPE_SPECS = (2, 3)
"""Layer specs of Megatron-DeepSpeed's GPTModelPipe around the transformer layers, which
partition_method type:transformer weighs 0: before them _to_float16 and the embedding, after
them the final norm, the (tied) head and float16_to_fp32 (megatron/model/gpt_model.py of
deepspeedai/Megatron-DeepSpeed; the last only for fp16/bf16, and it moves no block)."""


@lru_cache(maxsize=256)
def deepspeed_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Blocks per stage as DeepSpeed's PipelineModule._partition_layers cuts GPTModelPipe with
    partition_method type:transformer: deepspeed.runtime.utils.partition_balanced (DeepSpeed
    0.19's dynamic programme for the linear partition problem: the cut minimising the largest
    minus the smallest part, ties to the later cut; older releases bisected on the bottleneck)
    over weights 1 per transformer layer and 0 per other spec. tests/unit/search/test_partition.py holds it against the installed
    DeepSpeed's own function."""
    before, after = GPT_MODEL_PIPE_SPECS
    w = np.array([0.0] * before + [1.0] * num_layers + [0.0] * after)
    n, m = len(w), stages
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=np.int64)
    dp_max[0, 0] = 0.0
    for i in range(1, n + 1):  # every part count j at once (row i reads only rows < i)
        ks = np.arange(i)[:, None]
        part = prefix[i] - prefix[ks]
        js = np.arange(1, min(i, m) + 1)
        hi = np.maximum(dp_max[ks, js - 1], part)
        lo = np.minimum(dp_min[ks, js - 1], part)
        k = i - 1 - np.argmin((hi - lo)[::-1], axis=0)  # the last k of least cost (`>=` in theirs)
        cols = np.arange(len(js))
        dp_max[i, js], dp_min[i, js], position[i, js] = hi[k, cols], lo[k, cols], k
    cuts = [n]
    for j in range(m, 0, -1):
        cuts.append(int(position[cuts[-1], j]))
    cuts.reverse()
    return tuple(int(prefix[cuts[s + 1]] - prefix[cuts[s]]) for s in range(m))


def stage_layers(model: ModelSpec, pp: int, vpp: int, split: str) -> tuple[int, ...] | None:
    """Blocks per stage (pp * vpp stages in model order) of a non-even split ("balanced",
    "ends", "embed-loss" or "deepspeed"), or None when that split cannot cut the model into so
    many stages (DeepSpeed's pipeline has one stage per rank, each with a block)."""
    stages = pp * vpp
    if split == "balanced":
        return balanced_layers(model, stages)
    if split == "ends":
        return ends_lighter_layers(model.num_layers, stages)
    if split == "embed-loss":
        return embed_loss_layers(model.num_layers, stages)
    if split == "deepspeed":
        if vpp != 1 or model.num_layers + sum(GPT_MODEL_PIPE_SPECS) <= stages:
            return None
        lps = deepspeed_layers(model.num_layers, stages)
        return lps if min(lps) >= 1 else None
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


@lru_cache(maxsize=64)
def _path_flops(model: ModelSpec) -> tuple[np.ndarray, float, float]:
    """(each block's, the embedding's, the head's) FLOPs per token along layer_graph's path
    (embedding, the blocks, head), built once per model: the search asks for them for every
    pipeline shape."""
    block, embed, head = node_flops(model)
    w = np.full(model.num_layers, block)
    w.setflags(write=False)
    return w, embed, head


def heaviest_rank_flops(model: ModelSpec, lps: tuple[int, ...], pp: int, vpp: int,
                        zero_bubble: bool = False) -> float:
    """FLOPs per token of the most loaded pipeline rank (embedding on stage 0, head on the last
    stage, also when those stages hold no block), the quantity the balanced split minimises."""
    w, embed, head = _path_flops(model)
    bounds = np.concatenate([[0], np.cumsum(lps)])
    stage = [float(w[bounds[k]:bounds[k + 1]].sum()) for k in range(len(lps))]
    stage[0] += embed
    stage[-1] += head
    return max(sum(stage[s] for s in ss) for ss in rank_stages(pp, vpp, zero_bubble))


def split_columns(model: ModelSpec, pp: int, vpp: int, split: str = "balanced",
                  zero_bubble: bool = False) -> tuple[int, int, int, int] | None:
    """(layers_first, layers_max, layers_last, chunk_min) of an uneven split for estimate_table."""
    lps = stage_layers(model, pp, vpp, split)
    return None if lps is None else (*columns_of(lps, pp, vpp, zero_bubble),
                                          min(n for n in lps if n > 0))
