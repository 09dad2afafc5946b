"""Local moves for the Optuna search: when the sampler proposes a layout the study already
scored (TPE does this once it has converged), try an untried neighbour of the best layouts
instead: the same choices with one knob moved one step (ordinal) or switched (categorical).

Moves are enqueued as Optuna trials and chosen from what the storage holds plus a seeded RNG,
so an interrupted search resumes into the same moves.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autoplan.search.pareto import pareto_mask

ELITES = 5
"""Best layouts whose neighbourhoods are searched (single objective), in rank order."""


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def neighbours(trial: FrozenTrial) -> list[dict[str, Any]]:
    """The trial's choices with one knob moved: ordinal +-1 step, or another category."""
    out = []
    for name, dist in trial.distributions.items():
        value = trial.params[name]
        if isinstance(dist, IntDistribution):
            alts: list[Any] = [v for v in (value - 1, value + 1) if dist.low <= v <= dist.high]
        elif isinstance(dist, CategoricalDistribution):
            alts = [c for c in dist.choices if c != value]
        else:
            continue
        out += [{**trial.params, name: a} for a in alts]
    return out


def elites(trials: list[FrozenTrial], rng: np.random.Generator) -> list[FrozenTrial]:
    """Feasible scored trials to move from: the best few, or the Pareto front shuffled."""
    good = [t for t in trials if "reason" in t.user_attrs["record"]
            and t.user_attrs["record"]["reason"] < 0]
    if not good:
        return []
    obj = np.array([t.user_attrs["record"]["objectives"] for t in good], dtype=float)
    if obj.shape[1] == 1:
        order = np.lexsort((np.arange(len(good)), obj[:, 0]))
        return [good[i] for i in order[:ELITES]]
    front = np.flatnonzero(pareto_mask(obj))
    return [good[i] for i in rng.permutation(front)]


def next_move(study: optuna.Study, rng: np.random.Generator) -> dict[str, Any] | None:
    """An untried neighbour of an elite layout, or None when their neighbourhoods are done."""
    trials = study.get_trials(deepcopy=False)
    tried = set()
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.FAIL):
            tried.add(_params_key(t.params))
            if "fixed_params" in t.system_attrs:
                tried.add(_params_key(t.system_attrs["fixed_params"]))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for elite in elites(complete, rng):
        fresh = [n for n in neighbours(elite) if _params_key(n) not in tried]
        if fresh:
            return fresh[int(rng.integers(len(fresh)))]
    return None


def failed_since_last_complete(study: optuna.Study) -> int:
    """Proposals rejected as repeats since the last scored trial (read from storage)."""
    trials = study.get_trials(deepcopy=False)
    last = max((t.number for t in trials if t.state == TrialState.COMPLETE), default=-1)
    return sum(1 for t in trials if t.number > last and t.state == TrialState.FAIL)
