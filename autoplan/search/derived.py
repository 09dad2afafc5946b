"""The knobs a search space leaves for the search to derive per model and layout: `vpp: auto`
(the virtual stages the layers allow at each pp), `ep: null` and `etp: auto` (the expert-
parallel pairs a MoE model tries at each layout). Enumerating them is autoplan.search.space's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from autoplan.model_spec import ModelSpec
from autoplan.plan_rules import violations_of
from autoplan.plan_rules_layout import even_split_fits, virtual_stages_fit
from autoplan.plan_rules_moe import MOE_RULES
from autoplan.search_space import AUTO_VPP_ALL, SearchSpace, Split


def auto_vpp(num_layers: int, pp: int, ends_empty: bool = False) -> tuple[int, ...]:
    """`vpp: auto` at one pp: every vpp up to AUTO_VPP_ALL, and each deeper one whose virtual
    stages take a whole number of blocks, as Megatron-Core's --num-layers-per-virtual-
    pipeline-stage needs (megatron/training/arguments.py validate_args): pp * vpp divides the
    layers (the even split), or the layers plus one each for the embedding and the loss
    (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split: the
    "ends" split with both ends one block lighter, so at least two per virtual stage). No vpp
    that would leave a virtual stage without a block (plan_rules_layout.virtual_stages_fit; with
    `ends_empty`, the embed-loss split, the first and the last may hold none) is listed; pp 1
    has no virtual stages. Deep interleaving the layers do not divide needs a hand-written
    layout and is left to spaces that list it."""
    if pp <= 1:
        return (1,)
    vpp = np.arange(1, max((num_layers + 2) // pp, 1) + 1)
    stages = pp * vpp
    ends = ((num_layers + 2) % stages == 0) & ((num_layers + 2) // stages >= 2)
    whole = even_split_fits(num_layers, pp, vpp) | ends
    ok = virtual_stages_fit(num_layers, pp, vpp, ends_empty) & ((vpp <= AUTO_VPP_ALL) | whole)
    return tuple(int(v) for v in vpp[ok])


def vpp_choices(space: SearchSpace, model: ModelSpec, pp: int) -> tuple[int, ...]:
    """The vpp values the search tries at this pp: the space's list, or auto_vpp."""
    if space.pipeline.vpp is not None:
        return space.pipeline.vpp
    return auto_vpp(model.num_layers, pp, Split.EMBED_LOSS in space.pipeline.split)


DEFAULT_EP = (1, 2, 4, 8, 16, 32, 64)
"""Expert-parallel degrees a MoE model tries when the space leaves `ep` null."""


@lru_cache(maxsize=4096)
def expert_pairs(space: SearchSpace, model: ModelSpec | None, tp: int = 1,
                 group: int | None = None) -> list[tuple[int, int]]:
    """(ep, etp) pairs of a layout at this tp: the space's lists, or for `ep: null` [1] for a
    dense model and the DEFAULT_EP that divide a MoE model's experts; for `etp: auto` 1 and
    tp (Megatron-Core's ETP 1 or ETP = TP; once where tp is 1). A dense model tries etp 1
    only. Given `group` (the layout's dp * cp * tp), a MoE model keeps the pairs the expert
    rules (plan_rules_moe.MOE_RULES) allow there, all of them when none is (the rules then say
    why): a refused pair is never a plan, so it is neither listed nor sampled."""
    eps = space.parallel.ep
    moe = model.moe if model is not None else None
    if eps is None:
        eps = tuple(e for e in DEFAULT_EP if moe and moe.num_experts % e == 0) or (1,)
    etps = (space.parallel.etp or tuple(dict.fromkeys((1, tp)))) if moe else (1,)
    pairs = [(e, t) for e in eps for t in etps]
    if group is None or moe is None or model is None:
        return pairs
    ep, etp = np.array(pairs, dtype=np.int64).T
    one = np.ones_like(ep)
    table = {"dp": one * (group // tp), "cp": one, "tp": one * tp, "ep": ep, "etp": etp}
    bad = np.asarray(violations_of(MOE_RULES, table, model).any(axis=1))
    return [p for p, b in zip(pairs, bad, strict=True) if not b] or pairs
