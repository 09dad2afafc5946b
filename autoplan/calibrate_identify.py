"""Which factors one set of runs identifies: left_factors (those no run's prediction changes
with, or the profile gives nothing to scale), factor_shares (the share of the predicted step
time each governs) and chosen_factors (as many as the runs have different plans, by share)."""

from __future__ import annotations

import math
import random
import statistics

from autoplan.calibrate_factors import (
    FACTORS,
    active_factors,
    apply_factors,
    identity,
    profile_lacks,
)
from autoplan.calibrate_pricing import StepPricer
from autoplan.calibrate_runs import RunRecord, plan_key
from autoplan.hardware import ClusterProfile

UNFELT = "no run's predicted step time changes with it"
PROBES = 3
"""Settings of the other factors each factor is tried at (the unchanged profile, then seeded
random ones): a factor may only show where another has moved (overlap hiding a link)."""


def left_factors(runs: list[RunRecord], profile: ClusterProfile) -> dict[str, str]:
    """Factors the fit leaves at their start, with the reason: those the profile gives nothing
    to scale, and those no run's prediction changes with across their range (single-node runs
    priced from measured collective tables never use the link bandwidth or latency). A factor
    no run can feel would otherwise be written at whatever value the sampler last drew."""
    left, space = profile_lacks(profile), active_factors(profile)
    rng, start, price = random.Random(0), identity(profile), StepPricer(runs, profile)
    settings = [start] + [
        {**start, **{k: _draw(rng, *bounds) for k, bounds in space.items()}}
        for _ in range(PROBES - 1)]
    for name, (lo, hi, _) in space.items():
        if not any(_changes(price, profile, setting, name, (lo, hi))
                   for setting in settings):
            left[name] = UNFELT
    return left


def _draw(rng: random.Random, lo: float, hi: float, log: bool) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi)


def _changes(price: StepPricer, profile: ClusterProfile, setting: dict[str, float],
             name: str, values: tuple[float, float]) -> bool:
    """Whether moving `name` from `setting` to either end of its range moves a prediction."""
    def errors(value: float) -> list[float]:  # predicted / measured - 1
        return price(apply_factors(profile, {**setting, name: value}))

    here = errors(setting[name])
    return any(not math.isclose(1.0 + a, 1.0 + b, rel_tol=1e-9)
               for value in values for a, b in zip(here, errors(value), strict=True))


SHARE_STEP = 1.1
"""Factor by which factor_shares moves a multiplier each way from its start."""


def factor_shares(runs: list[RunRecord], profile: ClusterProfile,
                  names: list[str]) -> dict[str, float]:
    """The share of the runs' predicted step time T each of `names` governs at the start
    profile, averaged over the runs: |d ln T / d ln f| for a multiplier (a part priced at x / f
    moves T by its share of it), and the fall of ln T from no overlap to full for `overlap` (the
    exposed communication it can hide).

    The multipliers' shares split T: each part of it is priced by one of them, so they add up
    to 100% (less where a part is priced by none). Overlap's is no part of its own: the
    communication it hides is inside the shares of the factors that price it (collective
    tables, links), so it is said apart (share_words) and never added to them."""
    start, price = identity(profile), StepPricer(runs, profile)

    def log_times(name: str, value: float) -> list[float]:  # ln T, less ln measured
        return [math.log1p(e) for e in price(apply_factors(profile, {**start, name: value}))]

    shares = {}
    for name in names:
        if FACTORS[name][2]:
            up, down = (log_times(name, start[name] * s) for s in (SHARE_STEP, 1 / SHARE_STEP))
            spread = 2 * math.log(SHARE_STEP)
        else:
            up, down, spread = log_times(name, 0.0), log_times(name, 1.0), 1.0
        shares[name] = statistics.fmean(abs(a - b) / spread for a, b in zip(up, down,
                                                                             strict=True))
    return shares


def share_words(name: str, share: float) -> str:
    """What `share` (factor_shares') is for factor `name`, in words: a part of the predicted
    step time, or for overlap the part of it that full overlap would hide."""
    if name == "overlap":
        return f"could hide {share:.0%} of the predicted step time"
    return f"governs {share:.0%} of the predicted step time"


def _few_plans(plans: int, name: str, share: float) -> str:
    """Why a felt factor was left: the runs' plans identify fewer factors than they feel."""
    many = plans != 1
    return (f"{plans} different plan{'s' if many else ''} identif{'y' if many else 'ies'} "
            f"{plans} factor{'s' if many else ''}, and this one {share_words(name, share)}, "
            "less than those fitted")


def chosen_factors(runs: list[RunRecord], profile: ClusterProfile
                   ) -> tuple[dict[str, str], dict[str, float]]:
    """The factors the fit leaves at their start, with the reason, and the felt factors'
    shares: of the factors some run feels, as many as the runs have different plans are fitted,
    those that govern the largest share of the runs' predicted step time (ties in FACTORS
    order); the others are left."""
    left = left_factors(runs, profile)
    felt = [k for k in FACTORS if k not in left]
    plans = len({plan_key(r.plan) for r in runs})
    shares = factor_shares(runs, profile, felt)
    ranked = sorted(felt, key=lambda name: -shares[name])  # stable: FACTORS order breaks ties
    left.update({name: _few_plans(plans, name, shares[name]) for name in ranked[plans:]})
    return left, shares
