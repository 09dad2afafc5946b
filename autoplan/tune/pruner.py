"""Stop a trial that is clearly slower than the best finished one (an Optuna pruner)."""

from __future__ import annotations

import statistics

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


class SlowerThanBestPruner(BasePruner):
    """Prune once this trial's reported value over its last two steps (after `warmup_steps`)
    is `ratio` times worse than the best completed trial's at the same steps: below best/ratio
    where the study maximises (tokens/s, as tune reports), above ratio*best where it minimises
    (step time). Comparing step for step keeps warm-up (slow first steps, allocator and
    collective set-up) out of the verdict; unlike the median pruner, a plan is stopped only
    when it is clearly slower."""

    def __init__(self, ratio: float = 1.5, warmup_steps: int = 2) -> None:
        if ratio <= 1.0:
            raise ValueError("ratio must exceed 1")
        self.ratio = ratio
        self.warmup_steps = warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        steps = sorted(trial.intermediate_values)
        if len(steps) <= self.warmup_steps:
            return False
        recent = steps[self.warmup_steps:][-2:]
        mine = statistics.median(trial.intermediate_values[s] for s in recent)
        maximize = study.direction == StudyDirection.MAXIMIZE
        refs = []
        for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            values = [done.intermediate_values.get(s) for s in recent]
            if any(v is None for v in values):
                continue
            refs.append(statistics.median(v for v in values if v is not None))
        if not refs:
            return False
        if maximize:
            return mine * self.ratio < max(refs)
        return mine > self.ratio * min(refs)
