"""Calibration: fit a profile's efficiency factors to measured runs (`autoplan calibrate`).

The fit searches the multipliers of calibrate_factors with Optuna's TPE sampler, seeded,
starting from the unchanged profile so the fit never ends worse than it began on its runs, then
refines by pattern search. It fits no more factors than the runs have different plans (one
plan's runs tell one number, its measured / predicted ratio): those calibrate_identify chooses;
the rest are left as they were, and named. With three or more different plans each plan is
also predicted by a fit to the others alone (leave-one-plan-out), the error to expect on a plan
the fit has not seen. Peak memory can only raise the profile's reserved bytes.

The parts: run records (calibrate_runs), the device a run and a profile describe
(calibrate_devices), the factors (calibrate_factors), pricing runs (calibrate_pricing), which
factors runs identify (calibrate_identify); their public names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autoplan.calibrate_devices import check_runs, device_model, device_token, profile_file
from autoplan.calibrate_factors import (
    FACTORS,
    FAR,
    HOST_OVERHEADS,
    active_factors,
    apply_factors,
    fitted_values,
    identity,
    moved_far,
    ratio,
)
from autoplan.calibrate_identify import (
    PROBES,
    SHARE_STEP,
    UNFELT,
    chosen_factors,
    factor_shares,
    left_factors,
)
from autoplan.calibrate_pricing import StepPricer, memory_errors, step_errors
from autoplan.calibrate_runs import (
    MAX_STEP_TIME_S,
    MIN_STEP_TIME_S,
    Measured,
    RunRecord,
    load_run,
    plan_key,
)
from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, ClusterSpec

__all__ = [
    "FACTORS", "FAR", "HOST_OVERHEADS", "MAX_STEP_TIME_S", "MIN_HELD_OUT_PLANS", "MIN_STEP_TIME_S",
    "PROBES", "SHARE_STEP", "UNFELT", "Calibration", "Measured", "RunRecord", "StepPricer",
    "active_factors", "apply_factors", "calibrate", "check_runs", "device_model", "device_token",
    "factor_shares", "held_out_errors", "identity", "left_factors", "load_run", "memory_errors",
    "profile_file", "step_errors",
]


def _log_error(errors: list[float]) -> float:
    return statistics.fmean(abs(math.log1p(e)) for e in errors)


@dataclass(frozen=True)
class Calibration:
    profile: ClusterProfile
    factors: dict[str, float]
    step_errors_before: list[float]
    step_errors_after: list[float]
    memory_errors_before: list[float]
    memory_errors_after: list[float]
    left: dict[str, str] = dataclasses.field(default_factory=dict)
    """Factors left at their start value (left_factors), with the reason."""
    distinct_plans: int = 0
    """How many different plans the runs trained: the most factors the fit may set (one plan's
    runs tell one measured / predicted ratio, which any one factor can match)."""
    shares: dict[str, float] = dataclasses.field(default_factory=dict)
    """Share of the runs' predicted step time each felt factor governs (factor_shares): the
    order in which factors are fitted when the plans are fewer than they."""
    step_errors_held_out: list[float] | None = None
    """Each run's step error under a fit to the other plans' runs alone (leave-one-plan-out,
    held_out_errors); None under MIN_HELD_OUT_PLANS different plans, or when not asked for."""
    ratios: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Each factor as the ratio of the field it moves, after / before (None: moved from 0;
    factor_ratios): `factors` holds op_overhead_s and overlap as the values fitted."""
    values: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """The field each fitted factor moved (and the reserved bytes the memory fit raised):
    its name, value before and after, and ratio (calibrate_factors.fitted_values)."""

    @property
    def fitted(self) -> list[str]:
        return [name for name in FACTORS if name not in self.left]

    @property
    def unidentified(self) -> list[str]:
        """Factors some run feels but left at their start: the runs' plans were fewer
        (chosen_factors)."""
        return [name for name in FACTORS if name in self.shares and name in self.left]

    @property
    def at_bound(self) -> list[str]:
        """Fitted multipliers the search ended on a bound of (FACTORS, x0.1 or x10): the fit
        wanted further. op_overhead_s (seconds) and overlap (a share) end on theirs naturally:
        no host cost, no or full overlap."""
        return [name for name in self.fitted if name not in ("op_overhead_s", "overlap")
                and any(math.isclose(self.factors[name], b, rel_tol=1e-3)
                        for b in FACTORS[name][:2])]

    def summary(self) -> dict[str, Any]:
        def mape(errs: list[float]) -> float | None:
            return statistics.fmean(abs(e) for e in errs) if errs else None

        return {"runs": len(self.step_errors_before), "distinct_plans": self.distinct_plans,
                # every factor as a ratio after / before; the fitted fields' values apart
                "factors": dict(self.ratios),
                "values": dict(self.values), "factors_fitted": self.fitted,
                "factors_at_bound": self.at_bound, "factors_moved_far": moved_far(self.values),
                "factors_left": dict(self.left),
                "factors_unidentified": self.unidentified,
                "factor_shares": dict(self.shares),
                "step_time_mape_before": mape(self.step_errors_before),
                "step_time_mape_after": mape(self.step_errors_after),
                "step_time_mape_held_out": mape(self.step_errors_held_out or []),
                "memory_mape_before": mape(self.memory_errors_before),
                "memory_mape_after": mape(self.memory_errors_after)}


def _refine(factors: dict[str, float], loss: Any, space: dict[str, tuple[float, float, bool]],
            rounds: int = 4) -> dict[str, float]:
    """Pattern search from TPE's best: scale one factor at a time while the loss drops (the
    factors trade off against each other, which a sampler alone converges on slowly)."""
    best, best_loss = dict(factors), loss(factors)
    for _ in range(rounds):
        improved = False
        for name, (lo, hi, log) in space.items():
            for step in (0.5, 0.8, 0.95, 1.05, 1.25, 2.0):
                trial = dict(best)
                value = best[name] * step if log else best[name] + (step - 1.0) / 2
                trial[name] = min(hi, max(lo, value))
                trial_loss = loss(trial)
                if trial_loss < best_loss - 1e-12:
                    best, best_loss, improved = trial, trial_loss, True
        if not improved:
            break
    return best


def _fit(runs: list[RunRecord], profile: ClusterProfile, trials: int, seed: int
         ) -> tuple[dict[str, float], dict[str, str], dict[str, float]]:
    """The fitted factors, those left with the reason, and the felt factors' shares: the
    factors chosen_factors chooses are fitted, the others left at their start."""
    import optuna

    left, shares = chosen_factors(runs, profile)
    space = {k: v for k, v in FACTORS.items() if k not in left}
    price = StepPricer(runs, profile)

    def full(f: dict[str, float]) -> dict[str, float]:
        return {**identity(profile), **f}

    def loss(f: dict[str, float]) -> float:
        return _log_error(price(apply_factors(profile, full(f))))

    def objective(trial: optuna.Trial) -> float:
        return loss({name: trial.suggest_float(name, lo, hi, log=log)
                     for name, (lo, hi, log) in space.items()})

    if not space:  # nothing a run can feel: the profile's factors stand
        return identity(profile), left, shares
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial({k: v for k, v in identity(profile).items() if k in space})
    study.optimize(objective, n_trials=trials)
    return full(_refine(dict(study.best_params), loss, space)), left, shares


MIN_HELD_OUT_PLANS = 3
"""Different plans a held-out error needs: with two, each is predicted from one plan's runs,
a one-factor fit that says more of that plan than of the fit."""


def held_out_errors(runs: list[RunRecord], profile: ClusterProfile, trials: int = 300,
                    seed: int = 0) -> list[float] | None:
    """Leave one plan out: each run's step error under the fit (the same rule, so one factor
    fewer at most) to the runs of every other plan; None under MIN_HELD_OUT_PLANS plans."""
    keys = [plan_key(r.plan) for r in runs]
    if len(set(keys)) < MIN_HELD_OUT_PLANS:
        return None
    errors: list[float] = [0.0] * len(runs)
    for key in dict.fromkeys(keys):
        factors, _, _ = _fit([r for r, k in zip(runs, keys, strict=True) if k != key],
                             profile, trials, seed)
        out = [i for i, k in enumerate(keys) if k == key]
        for i, error in zip(out, step_errors([runs[i] for i in out],
                                             apply_factors(profile, factors)), strict=True):
            errors[i] = error
    return errors


def factor_ratios(profile: ClusterProfile, factors: dict[str, float]) -> dict[str, float | None]:
    """Every factor as after / before of the field it moves: the multipliers as they are,
    op_overhead_s and overlap (fitted as values) divided by the profile's own."""
    eff = profile.efficiency
    own = {"op_overhead_s": eff.op_overhead_s, "overlap": eff.overlap}
    return {name: ratio(own[name], value) if name in own else value
            for name, value in factors.items()}


def _shown_precision(runs: list[RunRecord], profile: ClusterProfile) -> str:
    """The peak calibrate shows compute's fit on: the runs' most common precision, where the
    profile has a peak for it (every peak moves alike)."""
    peaks = profile.device.peak_flops_per_s
    trained = [r.plan.precision.value for r in runs if r.plan.precision.value in peaks]
    return statistics.mode(trained) if trained else next(iter(peaks))


def calibrate(runs: list[RunRecord], profile: ClusterProfile, trials: int = 300,
              seed: int = 0, held_out: bool = False) -> Calibration:
    """Fit the factors to the runs' step times and the reserved bytes to their peak memory;
    with `held_out`, also each run's leave-one-plan-out error (held_out_errors)."""
    if not runs:
        raise ConfigError("RUNS", "no run records given", "pass one or more run record files")
    best, left, shares = _fit(runs, profile, trials, seed)
    fitted = apply_factors(profile, best)
    if any(r.measured.peak_memory_bytes for r in runs):
        # raise the fixed reserve by the largest shortfall, never lower it: memory predictions
        # must stay conservative, so a fit only ever makes them safer
        residual = max(
            r.measured.peak_memory_bytes - estimate_plan(
                r.plan, ClusterSpec(fitted, r.plan.cluster.num_gpus)).memory_total_bytes
            for r in runs if r.measured.peak_memory_bytes)
        reserved = int(fitted.device.reserved_bytes + max(0.0, residual))
        fitted = dataclasses.replace(
            fitted, device=dataclasses.replace(fitted.device, reserved_bytes=reserved))
    names = [name for name in FACTORS if name not in left]
    return Calibration(
        profile=fitted, factors=best, left=left, shares=shares,
        ratios=factor_ratios(profile, best),
        values=fitted_values(profile, fitted, names, _shown_precision(runs, profile)),
        distinct_plans=len({plan_key(r.plan) for r in runs}),
        step_errors_before=step_errors(runs, profile),
        step_errors_after=step_errors(runs, fitted),
        memory_errors_before=memory_errors(runs, profile),
        memory_errors_after=memory_errors(runs, fitted),
        step_errors_held_out=held_out_errors(runs, profile, trials, seed) if held_out else None)
