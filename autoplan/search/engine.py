"""One search, start to finish: the request, the sampler it picks, and the ranked result.

`run_search` enumerates (exhaustive) or samples (Optuna) the space, then ranks; the CLI renders
and writes what it returns. Progress is reported through a plain callback.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autoplan.cost.estimate import default_runtime
from autoplan.cost.kernel_rules import fused_attention_on
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.search.batch_range import check_batch_range
from autoplan.search.ranking import rank
from autoplan.search.sampled import SampledSpace, choose_sampler, sampling_note
from autoplan.search.scoring import Context, Scored, score_table
from autoplan.search.space import MAX_ROWS, enumerate_space, joint_rows
from autoplan.search.targets import Targets, objective_matrix
from autoplan.search_space import SearchSpace

if TYPE_CHECKING:
    from autoplan.search.nearest import Miss

log = logging.getLogger(__name__)

SAMPLERS = ("exhaustive", "tpe", "nsga2", "random")
Progress = Callable[[str, int, int], None]
"""progress(stage, done, total)."""


@dataclass(frozen=True)
class GpuType:
    """One GPU type of a multi-type search: its profile, the name given, and its GPU counts."""

    ref: str
    profile: ClusterProfile
    gpu_counts: tuple[int, ...]


@dataclass(frozen=True)
class SearchRequest:
    model: ModelSpec
    model_ref: str | ModelSpec
    """What plan.yaml names as its model: the preset name, or the spec inline."""
    profile: ClusterProfile
    profile_ref: str
    space: SearchSpace
    gpu_counts: tuple[int, ...]
    global_batch_size: int
    targets: Targets = field(default_factory=Targets)
    sampler: str | None = None
    """None: exhaustive when the space is enumerable, else tpe."""
    trials: int = 300
    seed: int = 0
    storage: str | None = None
    study: str | None = None
    worker: int = 0
    """Offsets the sampler seed so workers sharing one study explore differently."""
    runtime: RuntimeTraits | None = None
    """The runtime plans are priced for and must run on (None: autoplan's own on the device)."""
    global_batch_size_max: int | None = None
    """With a value: the search picks the global batch size in [global_batch_size, this]."""
    types: tuple[GpuType, ...] = ()
    """Several GPU types searched in one run (`--cluster A,B,C`); the first is profile."""
    gpu_range: tuple[int, int] | None = None
    """--num-gpus typed as a range A..B (gpu_counts: the counts of it searched); None where
    the counts were listed. For display only: the counts are what a study's fingerprint holds."""

    space_given: SearchSpace | None = None
    """The space as given, before `for_device` settled it (each GPU type settles its own)."""

    def __post_init__(self) -> None:
        if self.space_given is None:
            object.__setattr__(self, "space_given", self.space)
        # `precision: auto` settled for this device (fp16 on V100, bf16 on A100 and later), or
        # for every GPU type of a multi-type search alike (shared_precision)
        cpu = self.profile.is_cpu
        space = shared_precision(self.space, self.types) if self.types else self.space
        space = space.for_device(self.profile.device.peak_flops_per_s, cpu)
        # `attention: auto`: flash where the runtime runs a fused kernel on each type's device
        runtime = self.runtime or default_runtime(self.profile)
        fused = [fused_attention_on(runtime, p.device)
                 for p in ([t.profile for t in self.types] or [self.profile])]
        object.__setattr__(self, "space", space.for_runtime(fused).for_model(self.model.seq_len))

    @property
    def batch(self) -> tuple[int, int]:
        """(smallest, largest) global batch size the search may pick."""
        return self.global_batch_size, self.global_batch_size_max or self.global_batch_size

    def context(self) -> Context:
        return Context(self.model, self.profile, self.space, self.targets, self.runtime)

    def space_size(self) -> int:
        """Candidates an exhaustive search lists: valid layouts only, uneven splits where they
        differ from the even one (space.joint_rows)."""
        return joint_rows(self.space, self.model, self.gpu_counts, self.batch)

    def largest_count(self) -> tuple[int, int]:
        """(GPU count, its candidates) of the GPU count with the most of them."""
        if len(self.gpu_counts) == 1:
            return self.gpu_counts[0], self.space_size()
        return max(((n, joint_rows(self.space, self.model, (n,), self.batch))
                    for n in self.gpu_counts), key=lambda pair: pair[1])

    def largest_count_rows(self) -> int:
        """Candidates of the GPU count with the most of them."""
        return self.largest_count()[1]

    def pick_sampler(self) -> str:
        """--sampler, else sampled.choose_sampler's (exhaustive where max_enumerate allows)."""
        if self.sampler is not None:
            if self.sampler not in SAMPLERS:
                raise ConfigError("--sampler", f"got {self.sampler!r}",
                                  f"choose from {', '.join(SAMPLERS)}")
            return self.sampler
        return choose_sampler(self)[0]  # a range is scored count by count (run_exhaustive)


@dataclass(frozen=True)
class StudyCount:
    """One stored study of a sampled search: the complete trials it held when this process
    opened it, those this process added, and those it holds at the end (other workers sharing
    it add theirs)."""

    study: str
    stored: int
    new: int
    held: int


@dataclass
class SearchResult:
    request: SearchRequest
    sampler: str
    scored: Scored
    order: np.ndarray
    """Feasible rows, best first (the Pareto front first with several objectives)."""
    front: np.ndarray
    """Pareto-front mask over scored rows."""
    total: int
    """Candidates generated (exhaustive) or trials run (Optuna)."""
    seconds: float
    nearest: int | None = None
    """Row of the closest miss when nothing is feasible and something was scored."""
    miss: Miss | None = None
    """The closest miss and what it misses, whenever nothing is feasible."""
    counts_scored: tuple[int, ...] = ()
    """GPU counts whose candidates were scored: every requested one, but where an `--objective
    gpus` search stopped at the first count that meets the targets (run_exhaustive)."""
    type_misses: dict[str, Miss] = field(default_factory=dict)
    """A multi-type search: the nearest miss of each GPU type (by its name in --cluster) that
    has no feasible plan, as a search of that type alone gives it."""
    studies: tuple[StudyCount, ...] = ()
    """With --storage: each study's counts (one per GPU type of --cluster A,B)."""
    sampled: tuple[SampledSpace, ...] = ()
    """The space each sampled GPU type drew from (none for the exhaustive search)."""

    @property
    def best(self) -> int | None:
        return int(self.order[0]) if len(self.order) else None


MAX_TOTAL_ROWS = 10 * MAX_ROWS
"""Most candidates a range scores count by count (minutes of work on one core)."""
KEEP_PER_COUNT = 2000
"""Rows kept from each GPU count when a range is scored count by count: the best feasible ones
by every objective (and the Pareto front), and the closest misses."""


def _one_pass(req: SearchRequest, counts: tuple[int, ...]) -> tuple[Scored, int]:
    enum = enumerate_space(req.space, req.model, counts, req.batch,
                           limit=req.space.max_enumerate)
    scored = score_table(enum.table, req.context(),
                         counts={"world-size": enum.world_size_rejected, **enum.precounted})
    return scored, enum.total


def kept_rows(scored: Scored, targets: Targets) -> np.ndarray:
    """Rows of a table that can still matter: the best KEEP_PER_COUNT by the ranking and by
    each objective, the Pareto front and the KEEP_PER_COUNT nearest misses (what a range keeps
    of each count once every count is merged, and what trials.csv.gz holds by default)."""
    order, front = rank(scored, targets)
    keep = [order[:KEEP_PER_COUNT], np.flatnonzero(front)]
    obj = scored.cols["objectives"]
    for j in range(obj.shape[1] if targets.multi else 0):
        keep.append(order[np.argsort(obj[order, j], kind="stable")[:KEEP_PER_COUNT]])
    bad = np.flatnonzero(~scored.feasible)
    if len(bad):
        worst = np.max(scored.cols["miss"][bad], axis=1)
        keep.append(bad[np.argsort(worst, kind="stable")[:KEEP_PER_COUNT]])
    return np.unique(np.concatenate(keep)).astype(np.int64)


def merge_scored(parts: list[Scored], rows: list[np.ndarray] | None = None) -> Scored:
    """One Scored of several (their rows, or the given rows of each), counts summed."""
    if rows is None:
        rows = [np.arange(p.n) for p in parts]
    # a part with nothing scored lacks the estimate columns: it adds counts, never rows
    pairs = [(p, r) for p, r in zip(parts, rows, strict=True) if p.n] or [(parts[0], rows[0])]
    keys = [k for k in pairs[0][0].cols if all(k in p.cols for p, _ in pairs)]
    cols = {k: np.concatenate([np.asarray(p.cols[k])[r] for p, r in pairs]) for k in keys}
    counts: dict[str, int] = {}
    for p in parts:
        for k, v in p.counts.items():
            counts[k] = counts.get(k, 0) + v
    return Scored(cols, counts, parts[0].runtime)


def run_exhaustive(req: SearchRequest, progress: Progress | None = None
                   ) -> tuple[Scored, int, tuple[int, ...]]:
    """Every candidate scored: in one pass, or count by count when the GPU counts together
    exceed max_enumerate (each count's best and nearest rows kept). With the single objective
    gpus the counts go smallest first and stop at the first one with a feasible plan: every
    larger count ranks below it. Returns the scored rows, the candidates seen and the GPU
    counts scored."""
    step = progress or (lambda *_: None)
    counts = tuple(sorted(req.gpu_counts))
    rows = req.space_size()
    if len(counts) > 1 and rows > MAX_TOTAL_ROWS:
        raise ConfigError("max_enumerate", f"the space has {rows:,} candidates over "
                          f"{len(counts):,} GPU counts", f"the exhaustive search lists at most "
                          f"{MAX_ROWS:,} at once and {MAX_TOTAL_ROWS:,} count by count; narrow "
                          "--num-gpus or the space, or lower max_enumerate so TPE takes over")
    if len(counts) == 1 or rows <= req.space.max_enumerate:
        step("enumerate + score", 0, 1)
        scored, total = _one_pass(req, counts)
        step("rank", 1, 1)
        return scored, total, counts
    parts: list[Scored] = []
    kept: list[np.ndarray] = []
    total = 0
    done: list[int] = []
    smallest_first = req.targets.objectives == ("gpus",)
    for k, n in enumerate(counts):
        step("GPU counts", k, len(counts))
        part, seen = _one_pass(req, (n,))
        total += seen
        done.append(n)
        parts.append(part)
        kept.append(kept_rows(part, req.targets))
        if smallest_first and part.feasible.any():
            log.info("%d GPUs meet every target; larger counts not scored", n)
            step("GPU counts", k + 1, len(counts))  # the progress ends on the counts scored
            break
    else:
        step("GPU counts", len(counts), len(counts))
    return merge_scored(parts, kept), total, tuple(done)


def _score_one(req: SearchRequest, progress: Progress | None
               ) -> tuple[str, Scored, int, tuple[int, ...], StudyCount | None,
                          SampledSpace | None]:
    sampler, space = choose_sampler(req)
    if sampler == "exhaustive":
        if req.storage:
            raise ConfigError("--storage", "applies to the Optuna samplers",
                              "add --sampler tpe, nsga2 or random, or drop --storage")
        scored, total, counts = run_exhaustive(req, progress)
        study = None
    else:  # a batch range is a sampled knob there (trial_space.pick_batch)
        from autoplan.search.optuna_search import run_optuna

        scored, total, study = run_optuna(req, sampler, progress)
        # the counts its trials scored (a sampled range scores some of the counts asked for)
        counts = tuple(int(n) for n in np.unique(scored.cols["num_gpus"])) if scored.n else ()
    return sampler, scored, total, counts, study, space


def with_cluster(scored: Scored, k: int, ref: str, price: float | None, clusters: tuple[str, ...],
                 targets: Targets) -> Scored:
    """The rows tagged with their profile (index k of `clusters`) and its price per GPU-hour
    (NaN when the profile has none), objectives recomputed so cost is in US dollars."""
    n = scored.n
    cols = dict(scored.cols)
    cols["cluster"] = np.full(n, k, dtype=np.int64)
    cols["price_per_gpu_hour"] = np.full(n, np.nan if price is None else float(price))
    if n and "tokens_per_s" in cols:
        cols["objectives"] = objective_matrix(cols, targets)
    return Scored(cols, scored.counts, scored.runtime, clusters)


def shared_precision(space: SearchSpace, types: tuple[GpuType, ...]) -> SearchSpace:
    """`precision: auto` settled alike for every GPU type of a multi-type search: the formats
    any type picks for itself (in Precision's order), where each type either picks a format
    or lacks its tensor cores. Rows of one precision code then mean one format in every type,
    so they rank in one table, and an H100 keeps fp8 beside an A100's bf16 (the exhaustive
    search counts the A100's fp8 rows precision-unsupported; a sampled trial draws only the
    formats its device runs, trial_space.pick_precision): with the intersection, listing an A100 took fp8 from
    every type and the cheapest plan overall cost a third more than the H100's own. Types
    whose picks another type could run but would not pick (V100's fp16 beside an A100's bf16)
    keep their own, and search refuses the mix (search.cli.build_request)."""
    from autoplan.plan import Precision

    if space.precision or len(types) < 2:
        return space
    own = [space.for_device(t.profile.device.peak_flops_per_s, t.profile.is_cpu).precision
           for t in types]
    union = tuple(p for p in Precision if any(p in o for o in own))
    if all(p in o or p.value not in t.profile.device.peak_flops_per_s
           for t, o in zip(types, own, strict=True) for p in union):
        return dataclasses.replace(space, precision=union)
    return space


def type_requests(req: SearchRequest) -> list[SearchRequest]:
    """One request per GPU type, each with its own profile and counts, the precisions of
    shared_precision and the attention kernels the request settled for all types (codes alike
    across types: a V100's eager rows were read back as flash when each type settled its own),
    and with --study its own study, "STUDY/TYPE" (each type's trials answer its own
    request)."""
    if not req.types:
        return [req]
    given = shared_precision(req.space_given or req.space, req.types)
    if not given.attention:  # `auto` settled for every type alike, as the ranked rows are read
        # back (each type's runtime rules then refuse the kernel it cannot run)
        given = dataclasses.replace(given, attention=req.space.attention)
    return [dataclasses.replace(req, profile=t.profile, profile_ref=t.ref,
                                gpu_counts=t.gpu_counts, types=(), space=given,
                                study=f"{req.study}/{t.ref}" if req.study else None)
            for t in req.types]


def run_search(req: SearchRequest, progress: Progress | None = None) -> SearchResult:
    """Search the space and rank the result (never raises for an infeasible outcome). With
    several GPU types each is searched alone and the rows ranked together. A batch range no
    layout can take is refused (ConfigError) before any scoring."""
    t0 = time.perf_counter()
    check_batch_range(req.space, req.gpu_counts, req.batch)  # every type's counts together
    subs = type_requests(req)
    clusters = tuple(r.profile_ref for r in subs)
    parts, total, samplers, notes = [], 0, [], []
    type_misses: dict[str, Miss] = {}
    counts: set[int] = set()
    studies: list[StudyCount] = []
    spaces: list[SampledSpace] = []
    for k, sub in enumerate(subs):
        sampler, part, seen, done, study, space = _score_one(sub, progress)
        if study is not None:
            studies.append(study)
        if space is not None:
            spaces.append(space)
        samplers.append(sampler)
        total += seen
        counts.update(done)
        note = sampling_note(sub, sampler, part, seen)
        if note:
            notes.append(note + (f" for {sub.profile_ref}" if len(subs) > 1 else ""))
        if len(subs) > 1 and not part.feasible.any():
            type_misses[sub.profile_ref] = _type_miss(sub, part, note)
        parts.append(with_cluster(part, k, sub.profile_ref, sub.profile.price_per_gpu_hour,
                                  clusters, req.targets))
    scored = parts[0] if len(parts) == 1 else merge_scored(parts)
    scored = Scored(scored.cols, scored.counts, scored.runtime, clusters)
    sampler = ",".join(dict.fromkeys(samplers))
    order, front = rank(scored, req.targets)
    miss = None
    if not len(order):
        from autoplan.search.nearest import nearest_miss

        miss = nearest_miss(req, scored)
        if notes:  # last, so that the exit-3 line ends on what to do
            miss = dataclasses.replace(miss, misses=[*miss.misses, *notes],
                                       sampled_too_few=True)
    return SearchResult(req, sampler, scored, order, front, total,
                        time.perf_counter() - t0, miss.row if miss else None, miss,
                        tuple(sorted(counts)), type_misses, tuple(studies), tuple(spaces))


def _type_miss(sub: SearchRequest, part: Scored, note: str | None) -> Miss:
    """One GPU type's nearest miss, judged on its own request and rows as a search of that
    type alone judges it (a runtime rule every candidate breaks, in the rule's words), with its
    sampling note last."""
    from autoplan.search.nearest import nearest_miss

    miss = nearest_miss(sub, part)
    return dataclasses.replace(miss, misses=[*miss.misses, note]) if note else miss
