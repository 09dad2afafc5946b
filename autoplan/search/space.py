"""Enumerate a SearchSpace as a candidate table: the cartesian product by mixed-radix index
arithmetic in numpy (no Python loop over candidates).

The parallel layouts (num_gpus, tp, pp, cp) come first; dp is derived as num_gpus / (tp*pp*cp),
and layouts it cannot fill are counted as "world-size" rejections without being materialised.
Each layout is then crossed with its pipeline shapes (schedule, vpp and every layer split that
differs from the even one, with the layer columns the cost model prices), for a batch range
its global batch sizes (autoplan.search.ranges), and its expert-parallel pairs (the vpp and
(ep, etp) values a space leaves to the search come from autoplan.search.derived). Validity
rules and scoring are left to `autoplan.search.scoring`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.plan import RecomputeMethod, RecomputeModule, RecomputePolicy, Schedule
from autoplan.plan_table import (
    CHUNK_COLUMN,
    COLUMNS,
    DATA_PARALLEL_COLUMNS,
    EXPERT_COLUMNS,
    INTERLEAVED,
    RC_BLOCK,
    RC_METHODS,
    RECOMPUTE,
    RECOMPUTE_COLUMNS,
    REDUCE_DTYPES,
    SCHEDULES,
    ZERO_BUBBLE,
    modules_mask,
)
from autoplan.search.derived import expert_pairs, vpp_choices
from autoplan.search.partition import columns_of, heaviest_rank_flops, stage_layers
from autoplan.search.ranges import batch_sizes
from autoplan.search_space import SearchSpace, Split

EXTRA_COLUMNS = {"num_gpus": np.int64, "precision": np.int64, "attention": np.int64,
                 "layers_last": np.int64, "split": np.int64}
"""Columns beyond plan_table.COLUMNS: precision/attention are indexes into the space's lists,
split indexes search_space.Split (0 even, 1 balanced, 2 ends)."""
_MOE_MODULES = modules_mask((RecomputeModule.MOE, RecomputeModule.MOE_ACT))
"""The recompute modules only a MoE block has (plan_rules: recompute-moe-dense)."""
MAX_ROWS = 20_000_000
"""Most candidates the exhaustive search holds in memory at once (about 300 bytes each while
they are scored: ~6 GB); larger spaces go to the Optuna samplers."""


def recompute_pairs(space: SearchSpace, model: ModelSpec | None = None
                    ) -> list[tuple[int, int, int, int]]:
    """(policy code, num_layers or -1, modules mask, method code) choices: policy none only
    with -1 (num_layers is moot); selective with each module set; full with each method
    (uniform only where num_layers is a group size, not null). Given a dense `model`, the
    module sets naming MoE modules (moe, moe_act) are left out: plan_rules refuses them there
    (recompute-moe-dense), so listing them would only add candidates every search rejects."""
    rc = space.recompute
    modules = rc.modules
    if model is not None and model.moe is None:
        modules = tuple(ms for ms in modules if not (modules_mask(ms) & _MOE_MODULES))
    out = []
    for policy in rc.policy:
        code = RECOMPUTE.index(policy)
        if policy is RecomputePolicy.NONE:
            out.append((code, -1, 0, RC_BLOCK))
            continue
        for n in rc.num_layers:
            layers = -1 if n is None else n
            if policy is RecomputePolicy.SELECTIVE:
                out += [(code, layers, modules_mask(ms), RC_BLOCK) for ms in modules]
            else:
                out += [(code, layers, 0, RC_METHODS.index(m)) for m in rc.method
                        if m is RecomputeMethod.BLOCK or n is not None]
    if not out:  # RecomputeSpace refuses the spaces that leave none for any model
        _no_recompute_choice(space, model)
    return out


def _no_recompute_choice(space: SearchSpace, model: ModelSpec | None) -> None:
    """Raise the one-line error for a space whose recompute lists leave no choice: selective
    recompute with only MoE module sets, for a dense model."""
    rc = space.recompute
    listed = [[m.value for m in ms] for ms in rc.modules if ms is not None]
    name = model.name if model is not None else "the model"
    raise ConfigError(f"space {space.name}: recompute.modules",
                      f"policy {[p.value for p in rc.policy]} has no choice: its module sets "
                      f"{listed} name MoE modules, which the dense {name} does not have",
                      "add null or dense modules (core_attn, mlp, layernorm) to "
                      "recompute.modules, or none to recompute.policy")


def recompute_columns(space: SearchSpace, choice: np.ndarray, model: ModelSpec | None = None
                      ) -> dict[str, np.ndarray]:
    """The recompute columns of rows that took recompute_pairs(space, model)[choice];
    rc_modules and rc_method only where the space tries modules or the uniform method (else the
    tables stay as they were, and as fast)."""
    rc = np.array(recompute_pairs(space, model), dtype=np.int64).reshape(-1, 4)
    out = {"recompute": rc[choice, 0], "recompute_layers": rc[choice, 1]}
    if rc[:, 2:].any():
        out["rc_modules"], out["rc_method"] = rc[choice, 2], rc[choice, 3]
    return out


def shape_allowed(pp: int, schedule: int, vpp: int) -> bool:
    """False for the shapes the plan rules always refuse, which are never listed: vpp > 1
    without pp > 1 and an interleaving schedule (vpp-needs-interleaving), interleaved-1f1b with
    one chunk (interleaving-needs-vpp)."""
    if vpp > 1 and (pp == 1 or schedule not in (INTERLEAVED, ZERO_BUBBLE)):
        return False
    return not (schedule == INTERLEAVED and vpp < 2 and pp > 1)


def memory_triples(space: SearchSpace) -> np.ndarray:
    """(zero_stage, offload_optimizer, offload_params) rows the rules allow: offloaded
    parameters need ZeRO-3, an offloaded optimizer ZeRO >= 1 (all of them when none is)."""
    grid = [(z, o, p) for z in space.zero_stage for o in space.offload.optimizer
            for p in space.offload.params]
    ok = [t for t in grid if not (t[2] and t[0] != 3) and not (t[1] and t[0] == 0)]
    return np.array(ok or grid, dtype=np.int64).reshape(-1, 3)


def sp_values(space: SearchSpace, tp: int) -> list[bool]:
    """Sequence parallelism needs tp > 1 (sp-needs-tp): tp 1 lists only sp off when it can."""
    if tp == 1 and False in space.sequence_parallel:
        return [False]
    return list(space.sequence_parallel)


@lru_cache(maxsize=1024)
def pipeline_shapes(space: SearchSpace, model: ModelSpec, pp: int) -> np.ndarray:
    """Rows (schedule, vpp, split, layers_first, layers_max, layers_last, chunk_min) for one pp:
    every schedule and vpp of the space with the even split when the space has it (the rules
    judge whether it divides the layers; pp 1 has only that one), plus each uneven split of the
    space whose layer columns differ from the even split's and from the splits already listed
    (the same columns are the same plan)."""
    rows = []
    even_rank = -(-model.num_layers // pp)
    for schedule in space.pipeline.schedule:
        code = SCHEDULES.index(Schedule(schedule))
        for vpp in vpp_choices(space, model, pp):
            if not shape_allowed(pp, code, vpp):
                continue
            with_even = pp == 1 or Split.EVEN in space.pipeline.split
            if with_even:
                rows.append((code, vpp, 0, even_rank, even_rank, even_rank, even_rank // vpp))
            if pp == 1 or (vpp > 1 and code not in (INTERLEAVED, ZERO_BUBBLE)):
                continue  # one stage, or a vpp the schedule cannot run: no split to choose
            divides = model.num_layers % (pp * vpp) == 0
            # a DeepSpeed split is its own row even where another split prices the same:
            # the deepspeed runtime runs it and no other (RuntimeTraits.layer_splits)
            seen = {((even_rank,) * 3, ds) for ds in (False, True)} if with_even and divides \
                else set()
            zb = code == ZERO_BUBBLE
            # (only where the space lists the even split: without it an uneven split is the
            # only way to run this pipeline)
            even_load = heaviest_rank_flops(model, (model.num_layers // (pp * vpp),) * (pp * vpp),
                                            pp, vpp, zb) if divides and with_even else np.inf
            for split in space.pipeline.split:
                if split is Split.EVEN:
                    continue
                lps = stage_layers(model, pp, vpp, split.value)
                if lps is None:
                    continue
                cols = columns_of(lps, pp, vpp, zb)
                key = (cols, split is Split.DEEPSPEED)
                # an uneven split whose heaviest rank is no lighter than the even split's is
                # not listed where the even split exists (it cannot shorten the step)
                if key in seen or heaviest_rank_flops(model, lps, pp, vpp, zb) >= even_load:
                    continue
                seen.add(key)
                rows.append((code, vpp, list(Split).index(split), *cols, min(n for n in lps if n > 0)))
    return np.array(rows, dtype=np.int64).reshape(-1, 7)


@dataclass(frozen=True)
class Enumeration:
    table: dict[str, np.ndarray]
    """Candidate columns (plan_table.COLUMNS + EXTRA_COLUMNS), one row per candidate."""
    world_size_rejected: int
    """Candidates whose tp*pp*cp does not fill the GPU count (or gives a dp not allowed)."""
    total: int
    """Every candidate of the space, rejected ones included."""
    precounted: dict[str, int] = field(default_factory=dict)
    """Candidates counted by the rule they break without being listed (layouts whose dp does
    not divide the global batch: batch-divides, or an earlier rule on their layout alone)."""


def layouts(space: SearchSpace, gpu_counts: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Valid (num_gpus, dp, tp, pp, cp) rows and the number of (num_gpus, tp, pp, cp) misfits."""
    par = space.parallel
    grid = np.array(np.meshgrid(gpu_counts, par.tp, par.pp, par.cp, indexing="ij")).reshape(4, -1)
    n, tp, pp, cp = grid
    inner = tp * pp * cp
    ok = n % inner == 0
    dp = np.where(ok, n // np.maximum(inner, 1), 0)
    if par.dp is not None:
        ok &= np.isin(dp, par.dp)
    return np.stack([n, dp, tp, pp, cp])[:, ok], int((~ok).sum())


def check_rows(rows: int, limit: int | None) -> None:
    """Refuse, before anything is allocated, a table above `limit` or above MAX_ROWS."""
    if limit is not None and rows > limit:
        raise ConfigError("--sampler exhaustive", f"the space has {rows:,} candidates",
                          f"above max_enumerate={limit:,}; use --sampler tpe or a smaller space")
    if rows > MAX_ROWS:
        raise ConfigError("max_enumerate", f"the space has {rows:,} candidates to list (its "
                          f"max_enumerate is {limit or 0:,})", f"the exhaustive search holds at most "
                          f"{MAX_ROWS:,} (about 6 GB); lower max_enumerate so TPE takes "
                          "over, or shrink the space")


def _joint(lay: np.ndarray, space: SearchSpace, model: ModelSpec,
           batch: tuple[int, int]) -> dict[str, np.ndarray]:
    """Layouts crossed with their pipeline shapes, global batch sizes, sequence parallelism
    and expert-parallel pairs (the fastest), as columns."""
    names = ("num_gpus", "dp", "tp", "pp", "cp")
    shape_names = ("schedule", "vpp", "split", "layers_first", "layers_max", "layers_last",
                   CHUNK_COLUMN)
    parts: list[dict[str, np.ndarray]] = []
    shapes = {int(pp): pipeline_shapes(space, model, int(pp)) for pp in np.unique(lay[3])}
    for j in range(lay.shape[1]):
        sh = shapes[int(lay[3, j])]
        sizes = np.array(batch_sizes(*batch, int(lay[1, j])), dtype=np.int64)
        sps = np.array(sp_values(space, int(lay[2, j])), dtype=np.int64)
        group = int(lay[1, j] * lay[2, j] * lay[4, j])  # dp * tp * cp
        ex = np.array(expert_pairs(space, model, int(lay[2, j]), group),
                      dtype=np.int64).reshape(-1, 2)
        k, g, q, e = len(sh), len(sizes), len(sps), len(ex)
        part = {n: np.full(k * g * q * e, lay[i, j], dtype=np.int64)
                for i, n in enumerate(names)}
        for i, n in enumerate(shape_names):
            part[n] = np.repeat(sh[:, i], g * q * e)
        part["gbs"] = np.tile(np.repeat(sizes, q * e), k)
        part["sp"] = np.tile(np.repeat(sps, e), k * g)
        part["ep"], part["etp"] = np.tile(ex[:, 0], k * g * q), np.tile(ex[:, 1], k * g * q)
        parts.append(part)
    keys = (*names, *shape_names, "gbs", "sp", "ep", "etp")
    if not parts:
        return {n: np.zeros(0, dtype=np.int64) for n in keys}
    return {n: np.concatenate([p[n] for p in parts]) for n in keys}


def _misfit_candidates(space: SearchSpace, model: ModelSpec, gpu_counts: tuple[int, ...],
                       batch: tuple[int, int]) -> int:
    """Layouts whose tp*pp*cp does not fill the count, times the shapes each would have had."""
    par = space.parallel
    grid = np.array(np.meshgrid(gpu_counts, par.tp, par.pp, par.cp, indexing="ij")).reshape(4, -1)
    n, tp, pp, cp = grid
    ok = n % (tp * pp * cp) == 0
    dp = np.where(ok, n // (tp * pp * cp), 0)
    if par.dp is not None:
        ok &= np.isin(dp, par.dp)
    shapes = {p: len(pipeline_shapes(space, model, p)) for p in par.pp}
    sizes = len(batch_sizes(*batch, 1))
    return int(sum(shapes[int(p)] * _per_tp(space, model, int(t))
                   for p, t in zip(pp[~ok], tp[~ok], strict=True))) * sizes


def _per_tp(space: SearchSpace, model: ModelSpec, tp: int, group: int | None = None) -> int:
    """Rows of a layout at this tp (and dp * cp * tp = group) per pipeline shape and batch
    size: its sp values times its expert-parallel pairs."""
    return len(sp_values(space, tp)) * len(expert_pairs(space, model, tp, group))


def joint_rows(space: SearchSpace, model: ModelSpec, gpu_counts: tuple[int, ...],
               batch: tuple[int, int]) -> int:
    """Candidates the exhaustive search would list (valid layouts only), counted without
    listing them: the sampler choice and the size check use it. With one global batch size a
    layout whose dp does not divide it is counted by rule, never listed (enumerate_space), so
    it is not counted here either: counting it sent 64..1024 GPUs of a 70B model at batch 512
    to TPE (768 GPUs "held" 7.2M candidates against a max_enumerate of 5M; it lists 3.4M)."""
    lay, _ = layouts(space, gpu_counts)
    if batch[0] == batch[1]:
        lay = lay[:, batch[0] % lay[1] == 0]
    shapes = {p: len(pipeline_shapes(space, model, p)) for p in space.parallel.pp}
    per = np.array([shapes[int(p)] * _per_tp(space, model, int(t), int(d * t * c))
                    for d, t, p, c in zip(*lay[1:], strict=True)], dtype=np.int64)
    if batch[0] != batch[1]:
        per = per * np.array([len(batch_sizes(*batch, int(d))) for d in lay[1]], dtype=np.int64)
    return int(per.sum()) * _rest_size(space, model)


def _rest_axes(space: SearchSpace, model: ModelSpec | None = None
               ) -> list[tuple[str, np.ndarray]]:
    return [
        ("memory", np.arange(len(memory_triples(space)))),
        ("rc_pair", np.arange(len(recompute_pairs(space, model)))),
        ("mbs", np.array(space.micro_batch_size)),
        ("precision", np.arange(max(len(space.precision), 1))),
        ("attention", np.arange(len(space.attention))),
        ("dp_shard", np.array([d or 0 for d in space.parallel.dp_shard], dtype=np.int64)),
        ("grad_reduce", np.array([REDUCE_DTYPES.index(g) for g in space.grad_reduce_dtype],
                                 dtype=np.int64)),
    ]


def _rest_size(space: SearchSpace, model: ModelSpec | None = None) -> int:
    return math.prod(len(v) for _, v in _rest_axes(space, model))


def _materialize(joint: dict[str, np.ndarray], axes: list[tuple[str, np.ndarray]],
                 idx: np.ndarray, space: SearchSpace, model: ModelSpec) -> dict[str, np.ndarray]:
    """Rows `idx` of joint x axes (mixed radix, the last axis fastest) as typed columns."""
    rest = math.prod(len(v) for _, v in axes)
    joint_idx, rem = np.divmod(idx, rest)
    t: dict[str, np.ndarray] = {}
    for name, values in reversed(axes):  # last axis varies fastest
        rem, k = np.divmod(rem, len(values))
        t[name] = values[k]
    for name, values in joint.items():
        t[name] = values[joint_idx]
    t.update(recompute_columns(space, t.pop("rc_pair"), model))
    mem = memory_triples(space)[t.pop("memory")]
    t["zero_stage"], t["offload_optimizer"], t["offload_params"] = mem.T
    dtypes = {**COLUMNS, **EXTRA_COLUMNS, **EXPERT_COLUMNS, **DATA_PARALLEL_COLUMNS,
              **{k: v for k, v in RECOMPUTE_COLUMNS.items() if k in t}, CHUNK_COLUMN: np.int64}
    return {k: np.ascontiguousarray(t[k], dtype=dtypes[k]) for k in dtypes}


def _precount(joint: dict[str, np.ndarray], axes: list[tuple[str, np.ndarray]],
              space: SearchSpace, model: ModelSpec) -> dict[str, int]:
    """Rule counts of layouts whose dp does not divide the global batch, without listing their
    candidates: every one breaks batch-divides (gbs % (dp * mbs) != 0 for any mbs) unless a
    rule checked before it, which sees only the layout and pipeline shape (tp divides heads
    and ffn, pp * vpp divides the layers), fails first. One row per shape is judged."""
    from autoplan.plan_rules import RULE_KEYS
    from autoplan.search.scoring import first_rule

    n = len(joint["dp"])
    if n == 0:
        return {}
    one = [(name, values[:1]) for name, values in axes]
    table = _materialize(joint, one, np.arange(n, dtype=np.int64), space, model)
    rule = first_rule(table, model)
    batch = RULE_KEYS.index("batch-divides")
    assert rule.max() <= batch and rule.min() >= 0, "a layout-only rule set changed order"
    rest = math.prod(len(v) for _, v in axes)
    return {RULE_KEYS[r]: int((rule == r).sum()) * rest for r in np.unique(rule)}


def enumerate_space(space: SearchSpace, model: ModelSpec, gpu_counts: tuple[int, ...],
                    global_batch_size: int | tuple[int, int], limit: int | None = None,
                    sample: int | None = None) -> Enumeration:
    """Every candidate of `space` for the given GPU counts, as numpy columns; with `sample`,
    at most that many of them drawn without repeats (seeded: the same draw every time).
    `global_batch_size` is one size or a range (A, B) the search picks from."""
    batch = (global_batch_size, global_batch_size) if isinstance(global_batch_size, int) \
        else global_batch_size
    lay, _ = layouts(space, gpu_counts)
    axes = _rest_axes(space, model)
    rest = math.prod(len(v) for _, v in axes)
    precounted: dict[str, int] = {}
    if batch[0] == batch[1] and sample is None:
        bad = batch[0] % lay[1] != 0
        if bad.any():
            precounted = _precount(_joint(lay[:, bad], space, model, batch), axes, space, model)
            lay = lay[:, ~bad]
    joint = _joint(lay, space, model, batch)
    rows = len(joint["dp"]) * rest
    total = rows + sum(precounted.values()) \
        + _misfit_candidates(space, model, gpu_counts, batch) * rest
    if sample is None:
        check_rows(rows, limit)
        idx = np.arange(rows, dtype=np.int64)
    elif rows > sample:
        idx = np.sort(np.random.default_rng(0).choice(rows, sample, replace=False))
        rows = sample
    else:
        idx = np.arange(rows, dtype=np.int64)
    table = _materialize(joint, axes, idx, space, model)
    misfit = total - len(joint["dp"]) * rest - sum(precounted.values())
    return Enumeration(table, misfit, total, precounted)
