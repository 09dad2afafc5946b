"""One search, start to finish: the request, the sampler it picks, and the ranked result.

`run_search` enumerates (exhaustive) or samples (Optuna) the space, then ranks; the CLI renders
and writes what it returns. Progress is reported through a plain callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autoplan.cost.runtimes import RuntimeTraits
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.search.ranking import rank
from autoplan.search.scoring import Context, Scored, score_table
from autoplan.search.space import enumerate_space
from autoplan.search.targets import Targets
from autoplan.search_space import SearchSpace, Split

if TYPE_CHECKING:
    from autoplan.search.nearest import Miss

log = logging.getLogger(__name__)

SAMPLERS = ("exhaustive", "tpe", "nsga2", "random")
Progress = Callable[[str, int, int], None]
"""progress(stage, done, total)."""


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

    def context(self) -> Context:
        return Context(self.model, self.profile, self.space, self.targets, self.runtime)

    def space_size(self) -> int:
        return self.space.size(len(self.gpu_counts))

    def pick_sampler(self) -> str:
        if self.sampler is not None:
            if self.sampler not in SAMPLERS:
                raise ConfigError("--sampler", f"got {self.sampler!r}",
                                  f"choose from {', '.join(SAMPLERS)}")
            return self.sampler
        if self.space_size() <= self.space.max_enumerate:
            return "exhaustive"
        return "nsga2" if self.targets.multi else "tpe"


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

    @property
    def best(self) -> int | None:
        return int(self.order[0]) if len(self.order) else None


def run_exhaustive(req: SearchRequest, progress: Progress | None = None) -> tuple[Scored, int]:
    if Split.EVEN not in req.space.pipeline.split:
        raise ConfigError("--sampler exhaustive", "the space has no even split",
                          "add 'even' to pipeline.split or use --sampler tpe")
    if len(req.space.pipeline.split) > 1:
        log.info("exhaustive search enumerates even splits; use --sampler tpe for balanced ones")
    step = progress or (lambda *_: None)
    step("enumerate", 0, 3)
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size,
                           limit=req.space.max_enumerate)
    step("score", 1, 3)
    scored = score_table(enum.table, req.context(),
                         counts={"world-size": enum.world_size_rejected})
    step("rank", 2, 3)
    return scored, enum.total


def run_search(req: SearchRequest, progress: Progress | None = None) -> SearchResult:
    """Search the space and rank the result (never raises for an infeasible outcome)."""
    t0 = time.perf_counter()
    sampler = req.pick_sampler()
    if sampler == "exhaustive":
        if req.storage:
            raise ConfigError("--storage", "applies to the Optuna samplers",
                              "add --sampler tpe, nsga2 or random, or drop --storage")
        scored, total = run_exhaustive(req, progress)
    else:
        from autoplan.search.optuna_search import run_optuna

        scored, total = run_optuna(req, sampler, progress)
    order, front = rank(scored, req.targets)
    miss = None
    if not len(order):
        from autoplan.search.nearest import nearest_miss

        miss = nearest_miss(req, scored)
    return SearchResult(req, sampler, scored, order, front, total,
                        time.perf_counter() - t0, miss.row if miss else None, miss)
