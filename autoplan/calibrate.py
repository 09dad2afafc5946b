"""Calibration: fit a profile's efficiency factors to measured runs (`autoplan calibrate`).

A run record is what `autoplan train` writes at the end of a run: the plan as run, the profile
it was predicted with, and measured step time and peak memory. The fit searches a handful of
multipliers (compute peak, memory bandwidth, link bandwidth and latency, per-operator dispatch,
overlap) with Optuna's TPE sampler, seeded, starting from the unchanged profile so the fit never
ends worse than it began on its runs. It fits no more factors than the runs have different
plans (one plan's runs tell one number, its measured / predicted ratio): those that govern most
of the runs' predicted step time (factor_shares); the rest, and those no run's prediction
changes with, are left as they were, and named. With three or more different plans each plan is
also predicted by a fit to the others alone (leave-one-plan-out), the error to expect on a plan
the fit has not seen. Peak memory can only raise the profile's reserved bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoplan import resources
from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import (
    ClusterProfile,
    ClusterSpec,
    CollectiveTimes,
    LinkSpec,
    TimeTable,
    load_profile,
)
from autoplan.plan import Plan, plan_from_dict, plan_to_dict
from autoplan.yaml_io import check_schema_version, from_dict, read_yaml, show

MAX_STEP_TIME_S = 1e6
"""Longest measured step a run record may hold (11.6 days): far past it predicted / measured
rounds to 0 and the log error of the fit is undefined."""
MIN_STEP_TIME_S = 1e-9
"""Shortest measured step (a nanosecond): far below it predicted / measured overflows."""


@dataclass(frozen=True)
class Measured:
    step_time_s: float
    """Median seconds per optimizer step after warm-up."""
    peak_memory_bytes: float | None = None
    """Peak memory of the busiest rank (device memory on a GPU, RSS growth on CPU)."""
    tokens_per_s: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        if not self.step_time_s > 0:
            raise ConfigError("measured.step_time_s", f"got {self.step_time_s}",
                              "expected a positive number of seconds")
        if not MIN_STEP_TIME_S <= self.step_time_s <= MAX_STEP_TIME_S:
            raise ConfigError("measured.step_time_s", f"got {self.step_time_s:g}",
                              f"expected seconds per step from {MIN_STEP_TIME_S:g} to "
                              f"{MAX_STEP_TIME_S:g}")
        if self.peak_memory_bytes is not None and not self.peak_memory_bytes > 0:
            raise ConfigError("measured.peak_memory_bytes", f"got {self.peak_memory_bytes}",
                              "expected a positive number of bytes, or leave it out")


@dataclass(frozen=True)
class RunRecord:
    plan: Plan
    measured: Measured
    profile: str | None = None
    """Profile the run was predicted with (name or path)."""
    source: str = ""
    device: str | None = None
    """The device the run trained on (machine.device: `cpu` or the GPU's name, as torch
    names it); None in records written before train recorded it."""


def load_run(path: str | Path) -> RunRecord:
    data = read_yaml(path, f"RUN {path}")  # JSON is YAML, so both load
    if not isinstance(data, dict):
        raise ConfigError(f"RUN {path}", "expected a mapping with plan and measured")
    data = check_schema_version(data, "run")
    for key in ("plan", "measured"):
        if key not in data:
            raise ConfigError(f"RUN {path}: {key}", "missing", "pass a run record written by "
                              "`autoplan train --run-record FILE`")
    known = {"plan", "measured", "profile", "predicted", "metrics", "machine"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"RUN {path}: {sorted(unknown)[0]}", "unknown key",
                          f"valid keys: {', '.join(sorted(known))}")
    _check_measured_step(path, data["measured"])
    try:
        measured = from_dict(Measured, {k: v for k, v in data["measured"].items()
                                        if k in {f.name for f in dataclasses.fields(Measured)}}
                             if isinstance(data["measured"], dict) else data["measured"],
                             "measured")
    except ConfigError as err:  # name the run: calibrate reads many
        raise ConfigError(f"RUN {path}: {err.field}", err.problem, err.fix) from None
    profile = data.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"RUN {path}: profile", f"got {show(profile)}",
                          "expected the name or path of the profile the run was predicted with")
    return RunRecord(plan=_run_plan(path, data["plan"]), measured=measured,
                     profile=profile, source=str(path), device=_recorded_device(path, data))


def _run_plan(path: str | Path, data: Any) -> Plan:
    """The run's plan with its model loaded and the plan rules applied now, each mistake
    named with the run (calibrate reads many) before any study runs."""
    from autoplan.plan_rules import validate_plan

    try:
        plan = plan_from_dict(data)
        problems = validate_plan(plan, plan.model_spec())  # the plan's own GPU count
    except ConfigError as err:
        field = err.field if err.field.startswith("plan") else (
            f"plan.{err.field}" if err.field else "plan")
        raise ConfigError(f"RUN {path}: {field}", err.problem, err.fix) from None
    if problems:
        raise ConfigError(f"RUN {path}: plan", "; ".join(problems),
                          "pass run records of plans `autoplan train` ran")
    return plan


def _check_measured_step(path: str | Path, measured: Any) -> None:
    """A run with no step after its warm-up has no step time (train writes null)."""
    if isinstance(measured, dict) and "step_time_s" in measured \
            and measured["step_time_s"] is None:
        raise ConfigError(f"RUN {path}: measured.step_time_s", "null: the run had no step "
                          "after its warm-up step, so nothing was measured",
                          "calibrate with runs that train two steps or more (`autoplan "
                          "train --steps` counts from step 0, a resumed step included)")


def _recorded_device(path: str | Path, data: dict) -> str | None:
    machine = data.get("machine")
    if not isinstance(machine, dict) or machine.get("device") is None:
        return None
    device = machine["device"]
    if not isinstance(device, str) or not device.strip():
        raise ConfigError(f"RUN {path}: machine.device", f"got {show(device)}",
                          "expected the device the run trained on (cpu or a GPU's name)")
    return device


def profile_file(ref: str) -> Path | None:
    """The file a profile reference names (a name: the user's directory, then the built-in
    ones; else a path), resolved; None when there is none."""
    if resources.is_name(ref):
        found = resources.find(resources.PROFILES, ref)
        return found.resolve() if found is not None else None
    path = Path(ref).expanduser()
    try:
        return path.resolve() if path.is_file() else None
    except OSError:  # a name past NAME_MAX
        return None


def device_model(profile: ClusterProfile) -> str:
    """The device a profile describes, as runs on it would share it: `cpu` for a CPU host,
    else the GPU's model token (a100, h100, mi300x): the datasheet's `H100-SXM5-80GB` and
    torch's `NVIDIA H100 80GB HBM3` (a profile `autoplan profile` measured) are both h100."""
    if profile.is_cpu:
        return "cpu"
    return device_token(profile.device.name)


def device_token(name: str) -> str:
    """A device name as device_model compares it: `cpu`, or the GPU model's first word with a
    digit (`NVIDIA A100-SXM4-80GB` and `A100-SXM4-80GB` are both a100)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if words == ["cpu"]:
        return "cpu"
    return next((w for w in words if any(c.isdigit() for c in w)), " ".join(words))


def check_runs(runs: list[RunRecord], profile_ref: str, profile: ClusterProfile) -> None:
    """Refuse a run that trained on another device than `profile`'s (--profile;
    machine.device: a GPU plan run on a CPU host calibrates a CPU profile, not the GPU one),
    a run without machine.device recorded on a profile of another device or on a profile that
    does not exist here, and a run file given twice (it would count twice).
    A profile measured or calibrated from the run's one (same device) is what calibrate is
    for: runs recorded on cpu-gloo fit the profile `autoplan profile` measured on that host."""
    want = device_model(profile)
    seen: dict[tuple[int, int], str] = {}
    for run in runs:
        st = os.stat(run.source)
        if (st.st_dev, st.st_ino) in seen:
            raise ConfigError(f"RUN {run.source}", f"is the same file as "
                              f"{seen[(st.st_dev, st.st_ino)]}", "give each run record once")
        seen[(st.st_dev, st.st_ino)] = run.source
        _check_peak(run, profile_ref, profile)
        if run.device is not None and device_token(run.device) != want:
            raise ConfigError(
                f"RUN {run.source}: machine.device", f"the run trained on {show(run.device)}, "
                f"not on the {want} that --profile {show(profile_ref)} describes",
                f"fit a profile of {device_token(run.device)} to it (runs measure the device "
                "they ran on)")
        if run.profile is None or run.device is not None:
            # the device it trained on, when recorded, is what the measurement measured: a
            # plan made for another profile and run here calibrates this machine's profile
            continue
        if profile_file(run.profile) is None:
            raise ConfigError(f"RUN {run.source}", f"recorded on profile {show(run.profile)}, "
                              "which is neither a known profile nor a file",
                              f"calibrate with runs recorded on --profile {profile_ref}")
        recorded = load_profile(run.profile, f"RUN {run.source}: profile")
        if device_model(recorded) != want:
            raise ConfigError(
                f"RUN {run.source}", f"recorded on profile {show(run.profile)} "
                f"({recorded.device.name}), not on --profile {show(profile_ref)} "
                f"({profile.device.name})", "fit a profile only to runs measured on its device")


def _check_peak(run: RunRecord, profile_ref: str, profile: ClusterProfile) -> None:
    """A measured peak above the device's memory: the fit would raise the reserved bytes past
    the memory itself, a profile no run can fit on."""
    peak, memory = run.measured.peak_memory_bytes, profile.device.memory_bytes
    if peak is not None and peak > memory:
        raise ConfigError(f"RUN {run.source}: measured.peak_memory_bytes",
                          f"{peak:.4g} bytes, above the {memory} bytes of the "
                          f"{profile.device.name} of --profile {show(profile_ref)}",
                          "check the record: a run cannot peak above its device's memory, "
                          "or fit a profile of the device it ran on")


FACTORS = {  # name: (low, high, log scale)
    "compute": (0.1, 10.0, True),
    "memory_bandwidth": (0.1, 10.0, True),
    "link_bandwidth": (0.1, 10.0, True),
    "link_latency": (0.1, 10.0, True),
    "collective_tables": (0.1, 10.0, True),
    "op_overhead_s": (1e-7, 1e-3, True),
    "host_overheads": (0.1, 10.0, True),
    "overlap": (0.0, 1.0, False),
}


HOST_OVERHEADS = ("dtensor_op_overhead_s", "checkpoint_op_overhead_s", "selective_op_overhead_s",
                  "fsdp_unit_overhead_s", "optimizer_overhead_s", "dtensor_optimizer_overhead_s")
"""Measured host costs that `host_overheads` scales together (one host, one speed)."""


def apply_factors(profile: ClusterProfile, f: dict[str, float]) -> ClusterProfile:
    dev = profile.device
    device = dataclasses.replace(
        dev, peak_flops_per_s={k: v * f["compute"] for k, v in dev.peak_flops_per_s.items()},
        hbm_bytes_per_s=dev.hbm_bytes_per_s * f["memory_bandwidth"])

    def link(spec: LinkSpec) -> LinkSpec:
        return LinkSpec(spec.bytes_per_s * f["link_bandwidth"], spec.latency_s * f["link_latency"])

    eff = profile.efficiency
    eff = dataclasses.replace(
        eff, op_overhead_s=f["op_overhead_s"], overlap=f["overlap"],
        **{name: getattr(eff, name) * f["host_overheads"] for name in HOST_OVERHEADS})
    return dataclasses.replace(profile, device=device, intra_node=link(profile.intra_node),
                               inter_node=link(profile.inter_node), efficiency=eff,
                               collectives=_scaled(profile.collectives, f["collective_tables"]))


def _scaled(tables: CollectiveTimes | None, factor: float) -> CollectiveTimes | None:
    """The measured collective tables with every time multiplied by `factor`."""
    if tables is None:
        return None
    return CollectiveTimes(**{
        kind: {g: TimeTable(t.x, tuple(y * factor for y in t.y)) for g, t in by_group.items()}
        for kind, by_group in vars(tables).items() if by_group})


def identity(profile: ClusterProfile) -> dict[str, float]:
    return {"compute": 1.0, "memory_bandwidth": 1.0, "link_bandwidth": 1.0, "link_latency": 1.0,
            "collective_tables": 1.0, "host_overheads": 1.0,
            "op_overhead_s": max(profile.efficiency.op_overhead_s, 1e-7),
            "overlap": profile.efficiency.overlap}


def step_errors(runs: list[RunRecord], profile: ClusterProfile) -> list[float]:
    """predicted / measured - 1 for each run's step time."""
    out = []
    for run in runs:
        est = estimate_plan(run.plan, ClusterSpec(profile, run.plan.cluster.num_gpus))
        out.append(est.step_time_s / run.measured.step_time_s - 1.0)
    return out


class StepPricer:
    """step_errors of fixed runs under any profile, with what no factor changes (each run's
    model, plan row and runtime traits) done once and the runs of one model, precision and
    attention priced as one table (estimate_table, as estimate_plan prices one): a fit prices
    the runs hundreds of times."""

    def __init__(self, runs: list[RunRecord], profile: ClusterProfile) -> None:
        from autoplan.cost.estimate import default_runtime
        from autoplan.plan_table import plan_to_row

        self.traits = default_runtime(profile)  # a factor never makes a CPU profile a GPU's
        rows: list[Any] = []
        groups: dict[tuple, list[int]] = {}  # (model, precision, attention, columns) -> runs
        for i, run in enumerate(runs):
            model = run.plan.model_spec()
            rows.append(plan_to_row(run.plan, model))
            precision = run.plan.precision.value
            if precision not in profile.device.peak_flops_per_s:  # as estimate_plan falls back
                precision = next(iter(profile.device.peak_flops_per_s))
            key = (model, precision, run.plan.attention.value, tuple(sorted(rows[-1])))
            groups.setdefault(key, []).append(i)
        self.tables = [(model, precision, attention, np.array(where), {
            col: np.concatenate([np.atleast_1d(rows[i][col]) for i in where]) for col in cols})
            for (model, precision, attention, cols), where in groups.items()]
        self.measured_s = np.array([run.measured.step_time_s for run in runs], dtype=float)

    def __call__(self, profile: ClusterProfile) -> list[float]:
        from autoplan.cost.estimate import estimate_table

        predicted = np.empty_like(self.measured_s)
        for model, precision, attention, where, table in self.tables:
            predicted[where] = estimate_table(table, model, profile, precision, attention,
                                              self.traits)["time_step"]
        return [float(e) for e in predicted / self.measured_s - 1.0]


def memory_errors(runs: list[RunRecord], profile: ClusterProfile) -> list[float]:
    out = []
    for run in runs:
        if run.measured.peak_memory_bytes:
            est = estimate_plan(run.plan, ClusterSpec(profile, run.plan.cluster.num_gpus))
            out.append(est.memory_total_bytes / run.measured.peak_memory_bytes - 1.0)
    return out


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

    @property
    def fitted(self) -> list[str]:
        return [name for name in FACTORS if name not in self.left]

    @property
    def unidentified(self) -> list[str]:
        """Factors some run feels but left at their start: the runs' plans were fewer (_fit)."""
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
                "factors": self.factors, "factors_fitted": self.fitted,
                "factors_at_bound": self.at_bound, "factors_left": dict(self.left),
                "factors_unidentified": self.unidentified,
                "factor_shares": dict(self.shares),
                "step_time_mape_before": mape(self.step_errors_before),
                "step_time_mape_after": mape(self.step_errors_after),
                "step_time_mape_held_out": mape(self.step_errors_held_out or []),
                "memory_mape_before": mape(self.memory_errors_before),
                "memory_mape_after": mape(self.memory_errors_after)}


def active_factors(profile: ClusterProfile) -> dict[str, tuple[float, float, bool]]:
    """FACTORS less those this profile gives no effect (no measured collective tables, no
    measured host overheads)."""
    return {k: v for k, v in FACTORS.items() if k not in _profile_lacks(profile)}


def _profile_lacks(profile: ClusterProfile) -> dict[str, str]:
    """The factors `profile` gives nothing to scale, with the reason."""
    out = {}
    if profile.collectives is None:
        out["collective_tables"] = "the profile has no measured collective tables"
    if not any(getattr(profile.efficiency, name) for name in HOST_OVERHEADS):
        out["host_overheads"] = "the profile has no measured host overheads"
    return out


UNFELT = "no run's predicted step time changes with it"
PROBES = 3
"""Settings of the other factors each factor is tried at (the unchanged profile, then seeded
random ones): a factor may only show where another has moved (overlap hiding a link)."""


def left_factors(runs: list[RunRecord], profile: ClusterProfile) -> dict[str, str]:
    """Factors the fit leaves at their start, with the reason: those the profile gives nothing
    to scale, and those no run's prediction changes with across their range (single-node runs
    priced from measured collective tables never use the link bandwidth or latency). A factor
    no run can feel would otherwise be written at whatever value the sampler last drew."""
    left, space = _profile_lacks(profile), active_factors(profile)
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


def _plan_key(plan: Plan) -> str:
    """A plan as trained, less what it was predicted at."""
    data = plan_to_dict(plan)
    data.pop("predicted", None)
    return json.dumps(data, sort_keys=True, default=str)


SHARE_STEP = 1.1
"""Factor by which factor_shares moves a multiplier each way from its start."""


def factor_shares(runs: list[RunRecord], profile: ClusterProfile,
                  names: list[str]) -> dict[str, float]:
    """The share of the runs' predicted step time T each of `names` governs at the start
    profile, averaged over the runs: |d ln T / d ln f| for a multiplier (a part priced at x / f
    moves T by its share of it), and the fall of ln T from no overlap to full for `overlap` (the
    exposed communication it can hide)."""
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


def _few_plans(plans: int, share: float) -> str:
    """Why a felt factor was left: the runs' plans identify fewer factors than they feel."""
    many = plans != 1
    return (f"{plans} different plan{'s' if many else ''} identif{'y' if many else 'ies'} "
            f"{plans} factor{'s' if many else ''}, and this one governs {share:.0%} of the "
            "predicted step time, less than those fitted")


def _fit(runs: list[RunRecord], profile: ClusterProfile, trials: int, seed: int
         ) -> tuple[dict[str, float], dict[str, str], dict[str, float]]:
    """The fitted factors, those left with the reason, and the felt factors' shares: of the
    factors some run feels, the `plans` that govern the largest share of the runs' predicted
    step time are fitted (ties in FACTORS order), the others left at their start."""
    import optuna

    left = left_factors(runs, profile)
    felt = [k for k in FACTORS if k not in left]
    plans = len({_plan_key(r.plan) for r in runs})
    shares = factor_shares(runs, profile, felt)
    ranked = sorted(felt, key=lambda name: -shares[name])  # stable: FACTORS order breaks ties
    left.update({name: _few_plans(plans, shares[name]) for name in ranked[plans:]})
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
    keys = [_plan_key(r.plan) for r in runs]
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
    return Calibration(
        profile=fitted, factors=best, left=left, shares=shares,
        distinct_plans=len({_plan_key(r.plan) for r in runs}),
        step_errors_before=step_errors(runs, profile),
        step_errors_after=step_errors(runs, fitted),
        memory_errors_before=memory_errors(runs, profile),
        memory_errors_after=memory_errors(runs, fitted),
        step_errors_held_out=held_out_errors(runs, profile, trials, seed) if held_out else None)
