"""Stop a trial that is clearly slower than the best finished one (an Optuna pruner)."""

from __future__ import annotations

import statistics

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState


class SlowerThanBestPruner(BasePruner):
    """Prune once the median step time reported so far (after `warmup_steps`) exceeds `ratio`
    times the best completed trial's measured step time. Unlike the median pruner, a plan is
    stopped only when it is clearly slower, not when it is merely below the middle."""

    def __init__(self, ratio: float = 1.3, warmup_steps: int = 2) -> None:
        if ratio <= 1.0:
            raise ValueError("ratio must exceed 1")
        self.ratio = ratio
        self.warmup_steps = warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        done = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None]
        steps = sorted(trial.intermediate_values)
        if not done or len(steps) <= self.warmup_steps:
            return False
        recent = [trial.intermediate_values[s] for s in steps[self.warmup_steps:]]
        return statistics.median(recent) > self.ratio * min(done)
