"""Why a search found nothing: the nearest miss, for every sampler and every cause.

Candidates that were scored but miss (memory, targets): the one closest to working, and by how
much. Nothing scored (every candidate breaks a plan rule, or the device lacks the precision): a
seeded sample of the space's candidates judged by the same rules gives the one breaking the
fewest, with each rule's own message. No layout fills the GPU count: the nearest count one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoplan.cost import runtime_rules
from autoplan.cost.estimate import default_runtime
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile
from autoplan.plan import ClusterRef, Plan, ReduceDtype
from autoplan.plan_rules import BF16_REDUCE_PRECISIONS, RULES, violations
from autoplan.plan_table import REDUCE_DTYPES, row_to_plan
from autoplan.search.ranking import nearest
from autoplan.search.scoring import Scored, add_kernel_columns, runtime_lacks, score_table
from autoplan.search.space import enumerate_space, layouts
from autoplan.search.targets import MISS_KEYS, miss_messages

if TYPE_CHECKING:
    from autoplan.search.engine import SearchRequest
    from autoplan.search_space import SearchSpace

SAMPLE = 20_000
"""Candidates drawn from the space to find the nearest miss when nothing was scored."""


@dataclass(frozen=True)
class Miss:
    reason: str
    """The count key it falls under (a plan rule, precision-unsupported, world-size, or a
    target such as out-of-memory)."""
    misses: list[str]
    """What it misses and by how much, one message each."""
    row: int | None = None
    """Its row among the scored candidates, when it was scored."""
    plan: Plan | None = None
    """The candidate as a plan, when it was not scored (no prediction)."""
    sampled_too_few: bool = False
    """A sampled search scored too few trials to say nothing fits (sampled.sampling_note, the
    last of `misses`): more trials, not more GPUs, is the first thing to try."""


def nearest_miss(req: SearchRequest, scored: Scored) -> Miss:
    """The candidate closest to feasible, and what it misses (against its own GPU type's
    memory, named when the search spans several types)."""
    if scored.n:
        i = nearest(scored)
        assert i is not None
        c = scored.cols
        row = {k: float(c[k][i]) for k in ("mem_total", "mem_allocator", "mem_host",
                                           "time_step", "tokens_per_s", "num_gpus")}
        ref, prof = row_type(req, scored, i)
        misses = miss_messages(row, req.targets, prof)
        if len(req.types) > 1 and misses:
            misses[0] = f"on {int(row['num_gpus'])} x {ref}, {misses[0]}"
        reason = int(c["reason"][i])
        return Miss(MISS_KEYS[reason] if reason >= 0 else "non-finite", misses, row=i)
    lay, _ = layouts(req.space, req.gpu_counts)
    if not lay.shape[1]:
        return _world_size_miss(req)
    return _rule_miss(req)


MORE_GPUS_SPAN = 16
"""How far past its first count the suggested --num-gpus range runs: memory that does not
shard (activations) and communication that grows make the need more than proportional."""


def more_gpus(req: SearchRequest, scored: Scored, miss: Miss) -> dict[str, object] | None:
    """For a scored nearest miss of a single-type search (memory or a target): a --num-gpus
    range an `--objective gpus` search could find the fewest GPUs in. It starts at the power of
    two at or below the count that would close the shortfall if it shrank in proportion to the
    GPU count (memory sharded, throughput scaled), and above every count searched; it runs
    MORE_GPUS_SPAN times further. None where more GPUs are no answer the figures support, and
    where a sampled search scored too few trials to judge (its note says to raise --trials)."""
    from autoplan.search.ranges import MAX_GPUS

    if miss.row is None or miss.sampled_too_few or req.types or "miss" not in scored.cols:
        return None
    short = float(np.max(scored.cols["miss"][miss.row]))
    if not (np.isfinite(short) and short > 0):
        return None
    on = int(scored.cols["num_gpus"][miss.row])
    proportional = on * (1.0 + short)
    above = 1 << max(req.gpu_counts).bit_length()  # the first power of two past the searched
    lo = max(1 << (int(proportional).bit_length() - 1), above)
    hi = min(lo * MORE_GPUS_SPAN, MAX_GPUS, widest_world(req))
    if hi < lo:  # more GPUs than the batch and the model can be split over
        return None
    return {"num_gpus": f"{lo}..{hi}" if hi > lo else f"{lo}", "from": on, "short": short,
            "proportional": proportional}


def widest_world(req: SearchRequest) -> int:
    """An upper bound on the GPUs any plan of the space can use: dp at most the largest
    global batch (a micro-batch of one sequence each) times the largest tp that divides the
    heads, pp no deeper than the layers and cp of the space."""
    par, model = req.space.parallel, req.model
    dp = max(par.dp) if par.dp is not None else req.batch[1]
    tp = max((t for t in par.tp if model.num_heads % t == 0), default=1)
    pp = max((p for p in par.pp if p <= model.num_layers), default=1)
    return int(dp * tp * pp * max(par.cp))


def row_type(req: SearchRequest, scored: Scored, i: int) -> tuple[str, ClusterProfile]:
    """The GPU type (name, profile) a scored row was priced on: its `cluster` column indexes
    `req.types` in a multi-type search (engine.type_requests keeps their order)."""
    if not req.types or "cluster" not in scored.cols:
        return req.profile_ref, req.profile
    t = req.types[int(scored.cols["cluster"][i])]
    return t.ref, t.profile


def row_capacities(req: SearchRequest, scored: Scored) -> np.ndarray:
    """Each scored row's GPU memory in bytes: its own type's in a multi-type search."""
    if not req.types or "cluster" not in scored.cols:
        return np.full(scored.n, float(req.profile.device.memory_bytes))
    own = np.array([float(t.profile.device.memory_bytes) for t in req.types])
    return own[np.asarray(scored.cols["cluster"], dtype=np.int64)]


def _world_size_miss(req: SearchRequest) -> Miss:
    """No tp * pp * cp of the space fills any requested GPU count: the nearest count that one
    does (with dp among the space's values when the space fixes them)."""
    par = req.space.parallel
    products = sorted({tp * pp * cp for tp in par.tp for pp in par.pp for cp in par.cp})
    best: tuple[int, int, int] | None = None  # (distance, count, requested)
    for n in req.gpu_counts:
        for p in products:
            fills = [p * d for d in par.dp] if par.dp is not None \
                else [max(p, n // p * p), -(-n // p) * p]
            for m in fills:
                if best is None or (abs(m - n), m) < best[:2]:
                    best = (abs(m - n), m, n)
    assert best is not None
    dist, m, n = best
    shown = ", ".join(map(str, products[:8])) + (", ..." if len(products) > 8 else "")
    dp = f" with dp in {list(par.dp)}" if par.dp is not None else ""
    return Miss("world-size", [f"no tp * pp * cp of the space ({shown}) fills {n} GPUs{dp}; "
                               f"nearest GPU count it fills: {m} ({m - n:+d})"])


def _rule_miss(req: SearchRequest) -> Miss:
    """Judge a sample of the space by the plan rules and the device's precisions; the
    candidate with the fewest problems, each in the rule's own words."""
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size,
                           sample=SAMPLE)
    t = enum.table
    if len(t["pp"]) == 0:  # layouts fill the GPUs, but no pipeline shape is left for them
        par, pipe = req.space.parallel, req.space.pipeline
        return Miss("pp-vpp-divides-layers", [
            f"no pipeline shape of the space runs {req.model.name}'s {req.model.num_layers} "
            f"layers on pp in {list(par.pp)}: its schedules "
            f"{[s.value for s in pipe.schedule]}, vpp and splits "
            f"{[s.value for s in pipe.split]} leave none (pp may not exceed the layers, and an "
            "even split needs pp x vpp to divide them); add a smaller pp or other splits to the "
            "space"])
    bad = violations(t, req.model)
    peaks = req.profile.device.peak_flops_per_s
    lacking = np.array([p.value not in peaks for p in req.space.precision])[t["precision"]]
    reduce_bf16 = _bf16_reduce_without_bf16(req, t)
    unrun = runtime_lacks(with_kernel_columns(t, req.space), req.context())
    problems = bad.sum(axis=1) + lacking + reduce_bf16 + unrun
    i = int(np.argmin(problems))
    if problems[i] == 0:
        return _valid_sample_miss(req, t)
    misses = [RULES[j].message(t, i, req.model) for j in np.flatnonzero(bad[i])]
    reason = (RULES[int(np.argmax(bad[i]))].key if bad[i].any() else "precision-unsupported"
              if lacking[i] or reduce_bf16[i] else "runtime-unsupported")
    name = req.space.precision[int(t["precision"][i])].value
    if lacking[i]:
        misses.append(f"precision={name} is not supported by {req.profile.device.name} (it has "
                      f"{', '.join(peaks)}); put one of those in the space's precision list")
    elif reduce_bf16[i]:
        misses.append(f"grad_reduce_dtype=bf16 needs a bf16 or fp8 plan, and this one trains in "
                      f"{name} on {req.profile.device.name}; add null or fp32 to the space's "
                      "grad_reduce_dtype")
    plan = _plan(req, t, i)
    if unrun[i] and plan is not None:  # in the words `estimate` gives them
        misses += runtime_rules.refusals(plan, req.runtime or default_runtime(req.profile),
                                         req.model, req.profile.device)
    return Miss(reason, misses, plan=plan)


def with_kernel_columns(t: dict[str, np.ndarray], space: SearchSpace) -> dict[str, np.ndarray]:
    """`t` and the kernel columns the runtime rules read (scoring.add_kernel_columns)."""
    out = dict(t)
    add_kernel_columns(out, space)
    return out


def _bf16_reduce_without_bf16(req: SearchRequest, t: dict[str, np.ndarray]) -> np.ndarray:
    """Rows that reduce gradients in bf16 but train in a precision without bf16 gradients
    (scoring counts them precision-unsupported)."""
    if "grad_reduce" not in t:
        return np.zeros(len(t["precision"]), dtype=bool)
    has_bf16 = np.array([p.value in BF16_REDUCE_PRECISIONS for p in req.space.precision])
    return (t["grad_reduce"] == REDUCE_DTYPES.index(ReduceDtype.BF16)) & ~has_bf16[t["precision"]]


def _valid_sample_miss(req: SearchRequest, t: dict[str, np.ndarray]) -> Miss:
    """The sampler reached no valid candidate, but the space holds some."""
    sc = score_table(t, req.context())
    hint = (f"the space holds valid candidates the {req.pick_sampler()} search did not reach; "
            "raise --trials or use --sampler exhaustive")
    if not sc.n:
        return Miss("not-reached", [hint])
    miss = nearest_miss(req, sc)
    i = miss.row
    assert i is not None
    return Miss(miss.reason if miss.misses else "not-reached", [*miss.misses, hint],
                plan=_plan(req, sc.cols, i))


def _plan(req: SearchRequest, t: dict[str, np.ndarray], i: int) -> Plan | None:
    try:
        plan = row_to_plan(t, i, req.model_ref, ClusterRef(req.profile_ref,
                                                            int(t["num_gpus"][i])),
                           req.space.precision[int(t["precision"][i])])
        return plan.replace(attention=req.space.attention[int(t["attention"][i])])
    except ConfigError:  # a candidate too broken to be a plan at all
        return None
