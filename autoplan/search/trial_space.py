"""What one Optuna trial chooses and how it is scored.

A trial picks the *layout* of a plan: tp, pp, cp, the GPU count nearest the one it draws that they
fill (dp = count / (tp * pp * cp)), schedule, vpp, layer split, micro-batch size, the global batch
size when the request gives a range (and precision/attention when the space lists several; precision
among the formats the trial's device runs). The knobs that change neither the GPU count nor the
tokens of a step (sequence parallelism, ZeRO stage, offload, recompute policy and layers, the HSDP
shard group and the gradient reduce dtype, and for a MoE model the expert-parallel degrees ep and
etp) are then settled inside the trial by scoring all their valid combinations in one vectorised
pass and keeping the fastest that fits: at a fixed GPU count and batch every objective (throughput,
latency, cost) prefers the shorter step, so this inner choice is exact, and the sampler spends its
trials on the structure that matters. The batch is a sampled knob rather than an inner one because a
larger batch lengthens the step while it may raise the tokens per second.
"""

from __future__ import annotations

import warnings
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
from optuna.trial import Trial

from autoplan.plan import Precision, Schedule
from autoplan.plan_table import (
    CHUNK_COLUMN,
    COLUMNS,
    DATA_PARALLEL_COLUMNS,
    EXPERT_COLUMNS,
    INTERLEAVED,
    RECOMPUTE_COLUMNS,
    REDUCE_DTYPES,
    SCHEDULES,
    ZERO_BUBBLE,
)
from autoplan.search.engine import SearchRequest
from autoplan.search.partition import split_columns
from autoplan.search.ranges import batch_sizes
from autoplan.search.ranking import nearest
from autoplan.search.scoring import REASON_KEYS, canonical_schedule, score_table
from autoplan.search.space import (
    EXTRA_COLUMNS,
    expert_pairs,
    layouts,
    recompute_columns,
    recompute_pairs,
    vpp_choices,
)
from autoplan.search_space import SearchSpace, Split

DTYPES = {**COLUMNS, **EXTRA_COLUMNS, **EXPERT_COLUMNS, **DATA_PARALLEL_COLUMNS,
          CHUNK_COLUMN: np.int64}


class Unreachable(Exception):
    """A trial's fixed choice that this layout does not offer: a local move (local_moves.
    neighbours) keeps the other knobs' values while one moves, and an index or category fixed
    for one layout (vpp's index among pp 4's depths) can lie past another's list (pp 3's)."""


def _pick_degree(trial: Trial, knob: str, values: tuple[int, ...],
                 gpu_counts: tuple[int, ...]) -> int:
    fit = degrees(values, gpu_counts)
    return _pick(trial, degree_param(knob, values, fit), fit)


def _pick(trial: Trial, name: str, values: Any, relevant: bool = True,
          default: Any = None) -> Any:
    """Suggest a knob only where it matters; elsewhere use its no-op value if the space has it.
    Ordinal knobs (degrees, sizes) are suggested as an index so TPE models neighbourhoods. A
    fixed choice outside the list raises Unreachable (Optuna hands it back, with a warning)."""
    values = list(values)
    if not relevant and default in values:
        return default
    if len(values) == 1:
        return values[0]
    with warnings.catch_warnings():  # Optuna's "Fixed parameter ... out of range": raised below
        warnings.filterwarnings("ignore", message="Fixed parameter", category=UserWarning)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            ordered = sorted(values)
            i = trial.suggest_int(name, 0, len(ordered) - 1)
            if not 0 <= i < len(ordered):
                raise Unreachable(name)
            return ordered[i]
        try:  # a fixed category outside the choices: Optuna raises ValueError (choices.index)
            value = trial.suggest_categorical(name, values)
        except ValueError:
            raise Unreachable(name) from None
    if value not in values:
        raise Unreachable(name)
    return value


def degrees(values: tuple[int, ...], gpu_counts: tuple[int, ...]) -> list[int]:
    """The degrees of a knob (tp, pp or cp) that divide one of the request's GPU counts: the
    others fill none, and a trial spent on one is spent on nothing (pp 3 at 64 GPUs: more
    than half of the default space's layouts there; at 1 GPU every degree above 1). All of
    them where none divides (the trial is rejected as world-size then, as the exhaustive
    search rejects the whole space)."""
    fit = [v for v in values if any(n % v == 0 for n in gpu_counts)]
    return fit or list(values)


def degree_param(knob: str, values: tuple[int, ...], fit: list[int]) -> str:
    """The Optuna parameter a knob's degree is suggested as: its name where the request keeps
    every degree of the space, else `knob@fit`. A trial stores an index into the list, so a
    study stored before the filter (indexes into the whole list) resumes with its trials
    meaning what they meant: the filtered list is another parameter, and local moves keep
    each index within its own list."""
    return knob if len(fit) == len(values) else f"{knob}@fit"


def suggest_layout(trial: Trial, req: SearchRequest) -> dict[str, Any] | None:
    """The trial's layout; None when tp * pp * cp fills none of the GPU counts, or when a
    local move fixed a choice the layout does not offer (Unreachable). Its gbs is None where a
    batch range holds no size for its dp (pick_batch)."""
    try:
        return _suggest_layout(trial, req)
    except Unreachable:
        return None


def _suggest_layout(trial: Trial, req: SearchRequest) -> dict[str, Any] | None:
    sp, par = req.space, req.space.parallel
    wanted = _pick(trial, COUNT_PARAM, req.gpu_counts)
    tp, pp, cp = (_pick_degree(trial, k, getattr(par, k), req.gpu_counts)
                  for k in ("tp", "pp", "cp"))
    n = fill_count(req, wanted, tp * pp * cp)
    if n is None:
        return None
    schedule = _pick(trial, "schedule", [s.value for s in sp.pipeline.schedule], pp > 1,
                     SCHEDULES[canonical_schedule(sp)].value)
    code = SCHEDULES.index(Schedule(schedule))
    vpps = vpp_choices(sp, req.model, pp)
    if not vpps:  # more stages than the model has blocks (pp 64 for a 32-layer model)
        return None
    vpp = _pick(trial, "vpp", vpps, pp > 1 and code in (INTERLEAVED, ZERO_BUBBLE), 1)
    split = _pick(trial, "split", [s.value for s in sp.pipeline.split], pp > 1, "even")
    layout = {
        "num_gpus": n, "dp": n // (tp * pp * cp), "tp": tp, "pp": pp, "cp": cp, "vpp": vpp,
        "schedule": code, "split": list(Split).index(Split(split)),
        "mbs": _pick(trial, "mbs", sp.micro_batch_size),
        "precision": pick_precision(trial, req),
        "attention": sp.attention.index(_pick(trial, "attention", sp.attention)),
        "gbs": pick_batch(trial, req, n // (tp * pp * cp)),
    }
    even = -(-req.model.num_layers // pp)
    cols = None if split == Split.EVEN.value else \
        split_columns(req.model, pp, vpp, split, code == ZERO_BUBBLE)
    if cols is None:
        layout["split"] = 0
        cols = (even, even, even, even // vpp)
    (layout["layers_first"], layout["layers_max"], layout["layers_last"],
     layout[CHUNK_COLUMN]) = cols
    return layout


PRECISION_PARAM = "precision@device"
"""The Optuna parameter of the precision where the trial's device runs only some of the space's
formats (device_precisions: an A100 among a multi-type search's bf16 and fp8, or among a
space's bf16, fp16 and fp8). Studies stored before drew `precision` among all of them, and
Optuna refuses a categorical whose choices change under one name: a new name keeps their trials
meaning what they meant (as COUNT_PARAM), and a device that runs every format of the space (an
H100, every single-type search of `precision: auto`) keeps `precision`."""


def device_precisions(req: SearchRequest) -> list[Precision]:
    """The space's formats the request's device runs, in the space's order: those its profile
    has a peak for (scoring._estimate_groups counts the others precision-unsupported). An A100
    of a multi-type search drew fp8 in about half its trials and could score none of them. All
    of them where it runs none (every trial is then precision-unsupported, as the exhaustive
    search's rows are, and nearest.nearest_miss names the format)."""
    peaks = req.profile.device.peak_flops_per_s
    return [p for p in req.space.precision if p.value in peaks] or list(req.space.precision)


def pick_precision(trial: Trial, req: SearchRequest) -> int:
    """The trial's precision as an index into the space's formats (one code means one format in
    every GPU type: engine.shared_precision), drawn among those the device runs; not drawn
    where it runs one (or the space lists one)."""
    runs = device_precisions(req)
    name = "precision" if len(runs) == len(req.space.precision) else PRECISION_PARAM
    return req.space.precision.index(_pick(trial, name, runs))


COUNT_PARAM = "num_gpus@fill"
"""The Optuna parameter of the GPU count (an index into the request's counts) where there are
several: the count the trial takes is the nearest one its tp * pp * cp fills (fill_count).
Studies stored before it drew `num_gpus` and took that count or nothing; a new name keeps
their trials meaning what they meant."""


def fill_count(req: SearchRequest, wanted: int, inner: int) -> int | None:
    """The GPU count a trial of model-parallel size `inner` (tp * pp * cp) takes: of the
    request's counts that inner fills with a dp the space allows, preferring those whose dp
    divides the one global batch size (the others can hold no plan: batch-divides), the one
    nearest in log2 to `wanted` (ties to the smaller); None where inner fills none of them
    (world-size). Taking `wanted` or nothing wasted most trials of a range: 64..1024 is 121
    counts, and pp 9 or cp 16 fill few of them (231 of 300 trials rejected as world-size)."""
    par = req.space.parallel
    fits = [n for n in req.gpu_counts
            if n % inner == 0 and (par.dp is None or n // inner in par.dp)]
    lo, hi = req.batch
    takes = [n for n in fits if lo != hi or lo % (n // inner) == 0] or fits
    if not takes:
        return None
    return min(takes, key=lambda n: (abs(np.log2(n / wanted)), n))


@lru_cache(maxsize=64)
def _batch_choices(space: SearchSpace, gpu_counts: tuple[int, ...], lo: int, hi: int
                   ) -> list[int]:
    """Every global batch size some layout tries (ranges.batch_sizes over the data-parallel
    degrees the GPU counts allow): the sampler's one fixed list for `gbs`."""
    dps = np.unique(layouts(space, gpu_counts)[0][1])
    return sorted({g for d in dps.tolist() for g in batch_sizes(lo, hi, int(d))}) or [lo]


def pick_batch(trial: Trial, req: SearchRequest, dp: int) -> int | None:
    """The trial's global batch size: the request's one size, or for a range the size of this
    layout's own list (ranges.batch_sizes(lo, hi, dp), the sizes the exhaustive search lists for
    it) nearest in log2 to the one the sampler suggests from the fixed list of all of them
    (ties to the larger). Every trial gets a size its dp can take, or None where the range
    holds none for this dp (96..100 at dp 8: the exhaustive search lists no plan of that
    layout, and `evaluate` rejects the trial as "batch-range"); the sampler's distribution
    stays the same from trial to trial, so TPE models neighbouring sizes."""
    lo, hi = req.batch
    if lo == hi:
        return lo
    wanted = _pick(trial, "gbs", _batch_choices(req.space, req.gpu_counts, lo, hi))
    own = batch_sizes(lo, hi, max(dp, 1))
    if not own:
        return None
    return min(own, key=lambda g: (abs(np.log2(g / wanted)), -g))


def expert_choices(layout: dict[str, Any], req: SearchRequest) -> list[tuple[int, int]]:
    """(ep, etp) pairs of the space that the plan rules allow for this layout: ep divides the
    routed experts, etp the expert FFN width, and ep * etp the dp * cp * tp ranks Megatron-Core
    folds the expert grid into (plan_rules.MOE_RULES); a dense model has only (1, 1). When the
    space allows none, all its pairs (the rules then name what is wrong)."""
    group = layout["dp"] * layout["cp"] * layout["tp"]
    pairs = expert_pairs(req.space, req.model, layout["tp"], group)
    if req.model.moe is not None:
        return pairs
    return [p for p in pairs if p == (1, 1)] or pairs


def variants(layout: dict[str, Any], req: SearchRequest) -> dict[str, np.ndarray]:
    """The layout crossed with every memory-saving and expert-parallel choice of the space,
    as a table."""
    sp = req.space
    sp_values = [False] if layout["tp"] == 1 and False in sp.sequence_parallel \
        else list(sp.sequence_parallel)
    rc = np.array(recompute_pairs(sp, req.model), dtype=np.int64).reshape(-1, 4)
    ex = np.array(expert_choices(layout, req), dtype=np.int64).reshape(-1, 2)
    shards = np.array([d or 0 for d in sp.parallel.dp_shard], dtype=np.int64)  # 0: all of dp
    reduces = np.array([REDUCE_DTYPES.index(g) for g in sp.grad_reduce_dtype], dtype=np.int64)
    grid = np.meshgrid(np.array(sp_values, dtype=bool), np.array(sp.zero_stage),
                       np.array(sp.offload.optimizer, dtype=bool),
                       np.array(sp.offload.params, dtype=bool), np.arange(len(rc)),
                       np.arange(len(ex)), shards, reduces, indexing="ij")
    flat = [g.ravel() for g in grid]
    n = len(flat[0])
    t = {k: np.full(n, v) for k, v in layout.items()}
    t["sp"], t["zero_stage"], t["offload_optimizer"], t["offload_params"] = flat[:4]
    t.update(recompute_columns(sp, flat[4], req.model))
    t["ep"], t["etp"] = ex[flat[5], 0], ex[flat[5], 1]
    t["dp_shard"], t["grad_reduce"] = flat[6], flat[7]
    dtypes = {**DTYPES, **{k: v for k, v in RECOMPUTE_COLUMNS.items() if k in t}}
    return {k: np.asarray(t[k], dtype=dt) for k, dt in dtypes.items()}


def evaluate(layout: dict[str, Any] | None, req: SearchRequest) -> dict[str, Any]:
    """Score a layout's variants; the record stored on the trial (plain JSON values): the
    fastest variant that fits, else the nearest miss, else the rule most variants break (or
    world-size / batch-range for a layout with no GPU count or batch size to score)."""
    if layout is None:
        return {"rejected": "world-size", "layout": None}
    if layout["gbs"] is None:  # the batch range holds no size for its dp (pick_batch)
        return {"rejected": "batch-range", "layout": layout}
    table = variants(layout, req)
    scored = score_table(table, req.context())
    if scored.n == 0:
        rules = Counter({k: v for k, v in scored.counts.items() if v and k in REASON_KEYS})
        return {"rejected": rules.most_common(1)[0][0], "layout": layout}
    c = scored.cols
    feasible = np.flatnonzero(scored.feasible)
    if len(feasible):
        best = feasible[np.lexsort((feasible, c["mem_total"][feasible],
                                    c["time_step"][feasible]))[0]]
    else:
        best = nearest(scored)
    # the MFU ceiling is derived from error_bands.yaml when the study is read (optuna_search.
    # collect): a stored study shows the current bands' ceilings, and its records hold no NaN
    rec: dict[str, Any] = {k: np.asarray(v)[best].tolist() for k, v in c.items()
                           if k != "mfu_ceiling"}
    rec["layout"] = layout
    rec["variants"] = len(table)
    return rec
