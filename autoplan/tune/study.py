"""The tune loop: an Optuna study whose trials are short real runs of candidate plans.

The cost model's candidates are enqueued best first; each trial runs one plan, reports every
step time so the pruner can stop a clearly slower plan, and records a failure (out of memory,
crash, hang) with its reason instead of stopping the tune. With a storage URL an interrupted
tune resumes: finished trials (complete, pruned or failed) are not run again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import Plan, plan_from_dict, plan_to_dict
from autoplan.search.optuna_search import open_storage
from autoplan.tune.pruner import SlowerThanBestPruner
from autoplan.tune.runner import TrialOutcome, run_trial
from autoplan.yaml_io import dump_yaml, write_text_atomic

log = logging.getLogger(__name__)
STARTUP_S_PER_RANK = 2.0
"""Rough launch cost per rank on a small machine (torchrun + torch import), for --dry-run."""
STARTUP_S = 6.0


class TrialFailed(Exception):
    """A trial's run failed; the reason is kept on the trial and the tune carries on."""


def plan_key(plan: Plan) -> str:
    text = json.dumps(plan_to_dict(plan.replace(predicted=None)), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TuneConfig:
    steps: int = 8
    budget_s: float = 600.0
    trial_timeout_s: float = 180.0
    prune_ratio: float = 1.5
    storage: str | None = None
    study_name: str | None = None
    command: tuple[str, ...] | None = None
    """Trial command with {plan}, {nproc}, {steps}, {metrics} placeholders; default
    `autoplan train {plan} --nproc {nproc} --steps {steps} --metrics-file {metrics}`."""


@dataclass
class Candidate:
    plan: Plan
    key: str
    predicted_step_s: float
    predicted_memory_bytes: float
    source: str
    """'model rank N' or 'user'."""

    def predicted_trial_s(self, steps: int) -> float:
        return STARTUP_S + STARTUP_S_PER_RANK * self.plan.world_size + steps * self.predicted_step_s


def make_candidates(plans: list[tuple[Plan, str]]) -> list[Candidate]:
    out, seen = [], set()
    for plan, source in plans:
        key = plan_key(plan)
        if key in seen:
            continue
        seen.add(key)
        cluster = ClusterSpec(load_profile(plan.cluster.profile), plan.cluster.num_gpus)
        est = estimate_plan(plan, cluster)
        out.append(Candidate(plan, key, est.step_time_s, est.memory_total_bytes, source))
    return out


@dataclass
class TuneResult:
    candidates: list[Candidate]
    trials: list[dict[str, Any]] = field(default_factory=list)
    best_key: str | None = None
    seconds: float = 0.0

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.key == self.best_key), None)


def open_study(cfg: TuneConfig) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # the search's storage opener: SQLite transactions that pop a queued candidate are
    # serialised there, so two tunes sharing a study never run one candidate twice
    storage = open_storage(cfg.storage)
    try:
        return optuna.create_study(
            storage=storage, study_name=cfg.study_name, load_if_exists=bool(cfg.storage),
            direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0),
            pruner=SlowerThanBestPruner(cfg.prune_ratio))
    except (ValueError, ImportError, OSError) as err:
        raise ConfigError("--storage", f"cannot open {cfg.storage!r} ({err.__class__.__name__}: "
                          f"{str(err).splitlines()[0][:120]})",
                          "use sqlite:///path.db, an RDB URL or journal:PATH") from None
    except Exception as err:  # SQLAlchemy's errors: a bad URL or an unreachable database
        if err.__class__.__module__.startswith("sqlalchemy"):
            raise ConfigError("--storage", f"cannot open {cfg.storage!r} "
                              f"({err.__class__.__name__})",
                              "use sqlite:///path.db, an RDB URL or journal:PATH") from None
        raise


def _finished_keys(study: optuna.Study) -> set[str]:
    """Candidates with a result: complete, pruned, or failed for a reason of their own (a trial
    that failed because the tune itself was interrupted has no reason and runs again)."""
    done = set()
    for t in study.get_trials(deepcopy=False):
        key = t.params.get("candidate")
        if key and (t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                    or (t.state == TrialState.FAIL and "reason" in t.user_attrs)):
            done.add(key)
    return done


def run_tune(
    candidates: list[Candidate], cfg: TuneConfig, workdir: Path,
    on_trial: Callable[[Candidate, TrialOutcome], None] | None = None,
    runner: Callable[..., TrialOutcome] = run_trial,
) -> TuneResult:
    """Run every candidate not yet finished in the study, best predicted first, within budget."""
    start = time.monotonic()
    study = open_study(cfg)
    by_key = {c.key: c for c in candidates}
    keys = [c.key for c in candidates]
    pending = [k for k in keys if k not in _finished_keys(study)]
    waiting = {(t.system_attrs.get("fixed_params") or {}).get("candidate")
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for k in pending:
        if k not in waiting:  # left waiting by an interrupted tune: it runs first anyway
            study.enqueue_trial({"candidate": k})

    def objective(trial: optuna.Trial) -> float:
        key = trial.suggest_categorical("candidate", keys)
        cand = by_key[key]
        trial.set_user_attr("predicted_step_s", cand.predicted_step_s)
        trial.set_user_attr("source", cand.source)
        tdir = workdir / "trials" / key
        tdir.mkdir(parents=True, exist_ok=True)
        plan_path = tdir / "plan.yaml"
        write_text_atomic(plan_path, dump_yaml(plan_to_dict(cand.plan)), overwrite=True)
        remaining = cfg.budget_s - (time.monotonic() - start)

        def on_step(step: int, seconds: float) -> bool:
            trial.report(seconds, step)
            return trial.should_prune()

        command = None
        if cfg.command:
            fill = {"plan": str(plan_path), "nproc": str(cand.plan.world_size),
                    "steps": str(cfg.steps), "metrics": str(tdir / "metrics.jsonl")}
            command = [part.format(**fill) for part in cfg.command]
        outcome = runner(plan_path, cand.plan.world_size, cfg.steps, tdir,
                         max(5.0, min(cfg.trial_timeout_s, remaining)), on_step, command)
        trial.set_user_attr("step_times_s", outcome.step_times_s)
        trial.set_user_attr("wall_s", outcome.wall_s)
        if outcome.peak_memory_bytes is not None:
            trial.set_user_attr("peak_memory_bytes", outcome.peak_memory_bytes)
        if on_trial:
            on_trial(cand, outcome)
        if outcome.status == "pruned":
            trial.set_user_attr("reason", outcome.reason)
            raise optuna.TrialPruned(outcome.reason)
        if outcome.status == "failed":
            trial.set_user_attr("reason", outcome.reason)
            raise TrialFailed(outcome.reason)
        assert outcome.step_time_s is not None
        return outcome.step_time_s

    if pending:
        study.optimize(objective, n_trials=len(pending), catch=(TrialFailed,),
                       timeout=max(1.0, cfg.budget_s))
    result = TuneResult(candidates, seconds=time.monotonic() - start)
    latest: dict[str, Any] = {}  # key -> FrozenTrial
    for ft in study.get_trials(deepcopy=False):
        key = ft.params.get("candidate")
        if key in by_key:
            latest[key] = ft  # the last trial of a candidate wins (a rerun after a crash)
    for key in keys:
        t: Any = latest.get(key)
        if t is None:
            result.trials.append({"key": key, "status": "not run", "reason": "budget exhausted"})
            continue
        value = t.value if t.state == TrialState.COMPLETE else None
        result.trials.append({
            "key": key, "status": {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
                                   TrialState.FAIL: "failed"}.get(t.state, "interrupted"),
            "reason": t.user_attrs.get("reason", ""), "measured_step_s": value,
            "predicted_step_s": by_key[key].predicted_step_s,
            "peak_memory_bytes": t.user_attrs.get("peak_memory_bytes"),
            "steps_run": len(t.user_attrs.get("step_times_s", [])),
        })
    done = [r for r in result.trials if r["status"] == "complete"
            and r["measured_step_s"] is not None and math.isfinite(r["measured_step_s"])]
    if done:
        result.best_key = min(done, key=lambda r: r["measured_step_s"])["key"]
    return result


def run_record(cand: Candidate, trial: dict[str, Any], profile: str) -> dict[str, Any]:
    """A run record `autoplan calibrate` reads."""
    return {"schema_version": 1, "plan": plan_to_dict(cand.plan), "profile": profile,
            "measured": {"step_time_s": trial["measured_step_s"],
                         "peak_memory_bytes": trial.get("peak_memory_bytes"),
                         "steps": trial.get("steps_run")},
            "predicted": {"step_time_s": cand.predicted_step_s,
                          "memory_total_bytes": cand.predicted_memory_bytes}}


__all__ = ["Candidate", "TuneConfig", "TuneResult", "make_candidates", "plan_from_dict",
           "run_record", "run_tune"]
