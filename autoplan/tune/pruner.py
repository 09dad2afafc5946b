"""Stop a trial that is clearly slower than the best finished one (an Optuna pruner)."""

from __future__ import annotations

import math
import statistics

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

MIN_TIMED_STEPS = 3
"""Timed steps (after warm-up) a trial must have before it can be pruned."""


def timed_median(values: dict[int, float], warmup_steps: int) -> float | None:
    """The median of the values reported after the first `warmup_steps` steps; None when
    there are none."""
    timed = [values[s] for s in sorted(values)[warmup_steps:]]
    return statistics.median(timed) if timed else None


class SlowerThanBestPruner(BasePruner):
    """Prune a trial whose median reported value over its timed steps so far (every step after
    `warmup_steps`) is `ratio` times worse than the best completed trial's value, the figure
    the study ranks it by (tune: tokens/s of its median step time): below best/ratio where the
    study maximises (tokens/s, as tune reports steps), above ratio*best where it minimises
    (step time). Unlike the median pruner, a plan is stopped only when it is clearly slower.

    Medians, not single steps: on a shared machine one step runs up to ~2x off its neighbours
    (a collective that waited for a core, a step that ran alone), so comparing one step of a
    trial with the same step of the best one pruned plans within a few percent of it. The
    warm-up steps (allocator and collective set-up) are left out, and no trial is pruned before
    `min_timed_steps` timed steps: the median of three or more values ignores one outlier,
    where that of two is their mean and one odd step still moves it by half."""

    def __init__(self, ratio: float = 1.5, warmup_steps: int = 2,
                 min_timed_steps: int = MIN_TIMED_STEPS) -> None:
        if ratio <= 1.0:
            raise ValueError("ratio must exceed 1")
        if min_timed_steps < 1:
            raise ValueError("min_timed_steps must be at least 1")
        self.ratio = ratio
        self.warmup_steps = warmup_steps
        self.min_timed_steps = min_timed_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if len(trial.intermediate_values) < self.warmup_steps + self.min_timed_steps:
            return False
        mine = timed_median(trial.intermediate_values, self.warmup_steps)
        refs = [done.value for done in study.get_trials(deepcopy=False,
                                                        states=(TrialState.COMPLETE,))
                if done.value is not None and math.isfinite(done.value)]
        if mine is None or not refs:
            return False
        if study.direction == StudyDirection.MAXIMIZE:
            return mine * self.ratio < max(refs)
        return mine > self.ratio * min(refs)
