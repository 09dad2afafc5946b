"""The tune loop: an Optuna study whose trials are short real runs of candidate plans.

The cost model's candidates are enqueued best first; each trial runs one plan, reports every
step's throughput (tokens/s) so the pruner can stop a clearly slower plan, and records a failure
(out of memory, crash, hang) with its reason instead of stopping the tune. With a storage URL an
interrupted tune resumes: finished trials (complete, pruned or failed) are not run again, and
only for the same request (the study keeps a fingerprint of it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import Plan, plan_from_dict
from autoplan.plan_files import plan_identity, plan_to_dict
from autoplan.search.optuna_search import (
    FINGERPRINT_ATTRS,
    check_claim,
    claim_study,
    create_or_load,
)
from autoplan.search.storage import check_study_name, open_storage, peek_storage, shown_url
from autoplan.tune.pruner import SlowerThanBestPruner
from autoplan.tune.runner import TrialOutcome, run_trial
from autoplan.yaml_io import dump_yaml, write_text_atomic

log = logging.getLogger(__name__)
STARTUP_S_PER_RANK = 2.0
"""Rough launch cost per rank on a small machine (torchrun + torch import), for --dry-run."""
STARTUP_S = 6.0


class TrialFailed(Exception):
    """A trial's run failed; the reason is kept on the trial and the tune carries on."""


def trial_key(plan: Plan) -> str:
    """A short name of the plan as trained (plan_files.plan_identity's hash): trials of one plan
    share it."""
    return hashlib.sha1(plan_identity(plan).encode()).hexdigest()[:12]


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
    request: dict[str, Any] = field(default_factory=dict)
    """What the candidates answer (model, cluster, global batch size, sequence length): with
    the steps and the candidates' keys, the fingerprint a stored study must match to resume."""


@dataclass
class Candidate:
    plan: Plan
    key: str
    predicted_step_s: float
    predicted_memory_bytes: float
    source: str
    """'model rank N' or 'user'."""
    tokens_per_step: int
    """Tokens one step trains (global batch size x sequence length): trials are ranked and
    pruned by tokens/s, so plans of other batch sizes never win by a shorter step."""

    def predicted_trial_s(self, steps: int) -> float:
        return STARTUP_S + STARTUP_S_PER_RANK * self.plan.world_size + steps * self.predicted_step_s


def make_candidates(plans: list[tuple[Plan, str]]) -> list[Candidate]:
    out, seen = [], set()
    for plan, source in plans:
        key = trial_key(plan)
        if key in seen:
            continue
        seen.add(key)
        cluster = ClusterSpec(load_profile(plan.cluster.profile), plan.cluster.num_gpus)
        est = estimate_plan(plan, cluster)
        tokens = plan.batch.global_batch_size * plan.model_spec().seq_len
        out.append(Candidate(plan, key, est.step_time_s, est.memory_total_bytes, source, tokens))
    return out


@dataclass
class TuneResult:
    candidates: list[Candidate]
    trials: list[dict[str, Any]] = field(default_factory=list)
    best_key: str | None = None
    seconds: float = 0.0
    stored: int = 0
    """Candidates with a result in the --study when the tune opened it (not run again)."""
    new: int = 0
    """Trials this tune ran to a result (complete, pruned or failed)."""

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.key == self.best_key), None)


HOST_LOAD_KEYS = ("cpu_count", "load_avg_start", "load_avg_end")
"""What a trial's row keeps of runtime/machine.host_load, as a train run record's machine."""
FINGERPRINT_ATTR = FINGERPRINT_ATTRS["tune"]
DIRECTION: Literal["maximize"] = "maximize"
"""Trials are valued in measured tokens/s."""


def fingerprint(candidates: list[Candidate], cfg: TuneConfig) -> dict[str, Any]:
    """What a stored tune's results answer: the request, the steps per trial, the candidates."""
    return {**cfg.request, "steps": cfg.steps, "candidates": sorted(c.key for c in candidates)}


def open_study(cfg: TuneConfig, fp: dict[str, Any] | None = None) -> optuna.Study:
    """Create the tune's study and mark it with `fp`, or resume one marked with the same; refuse
    (exit 2) a name longer than storages hold, a search's study, one valued the other way, or
    one a tune with another request, steps or candidate list made. As in the search
    (optuna_search.open_study), only the process whose create_study made the study marks it
    (fingerprint first, then kind); one that found it waits for the mark and compares, so two
    first tunes with different requests on one name cannot both run in it."""
    # Optuna's warning and traceback for each failed trial would repeat the reason the tune
    # records and prints (and a stopped tune's traceback is no error)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    check_study_name(cfg.study_name)
    # the search's storage opener: SQLite transactions that pop a queued candidate are
    # serialised there, so two tunes sharing a study never run one candidate twice
    storage = open_storage(cfg.storage)
    with _opening_errors(cfg.storage):
        study, created = create_or_load(storage, cfg.study_name, [DIRECTION])
    study.sampler = optuna.samplers.RandomSampler(seed=0)
    study.pruner = SlowerThanBestPruner(cfg.prune_ratio)
    if created:
        if fp is not None:
            study.set_user_attr(FINGERPRINT_ATTR, _fingerprint_text(fp))
        claim_study(study, "tune", [DIRECTION], created=True)
        return study
    claim_study(study, "tune", [DIRECTION], created=False)  # waits for the maker's mark
    if fp is not None:
        _check_fingerprint(study, fp)
    return study


def check_study(cfg: TuneConfig, candidates: list[Candidate]) -> dict[str, dict[str, Any]]:
    """What open_study would refuse in `cfg`'s storage, found without creating or writing
    anything (a tune's --dry-run): a search's study, one valued the other way, another tune's.
    A storage or study not there yet passes: the tune would create it. Returns the rows
    (trial_row) of the candidates the study holds a result for, by key: the tune runs them
    not again."""
    check_study_name(cfg.study_name)
    if cfg.storage is None or cfg.study_name is None:
        return {}
    with _opening_errors(cfg.storage):
        storage = peek_storage(cfg.storage)
        if storage is None:
            return {}
        try:
            study = optuna.load_study(study_name=cfg.study_name, storage=storage)
        except KeyError:  # no study of that name
            return {}
    attrs = study.user_attrs
    check_claim(study, "tune", [DIRECTION], attrs)
    have = attrs.get(FINGERPRINT_ATTR)
    if have is not None:
        _refuse_another_tune(study, have, fingerprint(candidates, cfg))
    by_key = {c.key: c for c in candidates}
    return {key: trial_row(by_key[key], t) for key, t in _latest(study, finished=True).items()
            if key in by_key}


@contextmanager
def _opening_errors(url: str | None) -> Iterator[None]:
    """A storage that fails as the study is created or loaded, as one --storage line."""
    fix = "use sqlite:///path.db, an RDB URL or journal:PATH"
    shown = shown_url(url) if url else url
    try:
        yield
    except (ValueError, ImportError, OSError) as err:
        raise ConfigError("--storage", f"cannot open {shown!r} ({err.__class__.__name__}: "
                          f"{str(err).splitlines()[0][:120]})", fix) from None
    except Exception as err:  # SQLAlchemy's errors: a bad URL or an unreachable database
        if err.__class__.__module__.startswith("sqlalchemy"):
            raise ConfigError("--storage", f"cannot open {shown!r} "
                              f"({err.__class__.__name__})", fix) from None
        raise


def _fingerprint_text(fp: dict[str, Any]) -> str:
    return json.dumps(fp, sort_keys=True, default=str)


def _check_fingerprint(study: optuna.Study, fp: dict[str, Any]) -> None:
    """Refuse a study marked with another tune's fingerprint; mark one its maker never marked
    (it died first, with no trials: claim_study refuses one with trials)."""
    text = _fingerprint_text(fp)
    have = study.user_attrs.get(FINGERPRINT_ATTR)
    if have is None:
        study.set_user_attr(FINGERPRINT_ATTR, text)
        return
    _refuse_another_tune(study, have, fp)


def _refuse_another_tune(study: optuna.Study, have: str, fp: dict[str, Any]) -> None:
    """Refuse (naming what differs) a study whose stored fingerprint `have` is not `fp`'s."""
    if have == _fingerprint_text(fp):
        return
    try:
        stored = json.loads(have)
    except ValueError:
        stored = {}
    stored = stored if isinstance(stored, dict) else {}
    diffs = [("other candidate plans" if k == "candidates"
              else f"{k} {stored.get(k)!r}, now {fp.get(k)!r}")
             for k in sorted(set(stored) | set(fp)) if stored.get(k) != fp.get(k)]
    raise ConfigError("--study", f"{study.study_name!r} holds the results of another tune "
                      f"({'; '.join(diffs) or 'another request'})",
                      "rerun that exact command to resume it, or use another --study name")


def _finished(t: Any) -> bool:
    """A trial with a result: complete, pruned, or failed for a reason of its own (a trial
    that failed because the tune itself was interrupted has no reason and runs again)."""
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        t.state == TrialState.FAIL and "reason" in t.user_attrs)


def _latest(study: optuna.Study, finished: bool = False) -> dict[str, Any]:
    """Each candidate's last trial in the study (only those with a result: `finished`), by
    key: the last wins (a rerun after a crash)."""
    latest: dict[str, Any] = {}  # key -> FrozenTrial
    for t in study.get_trials(deepcopy=False):
        key = t.user_attrs.get("candidate")
        if key and (_finished(t) or not finished):
            latest[key] = t
    return latest


def run_tune(
    candidates: list[Candidate], cfg: TuneConfig, workdir: Path,
    on_trial: Callable[[Candidate, TrialOutcome], None] | None = None,
    runner: Callable[..., TrialOutcome] = run_trial,
) -> TuneResult:
    """Run every candidate not yet finished in the study, best predicted first, within budget;
    the best is the one with the most measured tokens/s."""
    start = time.monotonic()
    study = open_study(cfg, fingerprint(candidates, cfg))
    by_key = {c.key: c for c in candidates}
    keys = [c.key for c in candidates]
    stored = set(_latest(study, finished=True)) & set(keys)
    pending = [k for k in keys if k not in stored]
    ran = [0]
    waiting = {t.user_attrs.get("candidate")
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for k in pending:
        if k not in waiting:  # left waiting by an interrupted tune: it runs first anyway
            # the candidate is an attribute, not a parameter: no distribution over a list
            # that differs from one tune to the next
            study.enqueue_trial({}, user_attrs={"candidate": k})

    def objective(trial: optuna.Trial) -> float:
        cand = by_key.get(trial.user_attrs.get("candidate", ""))
        if cand is None:  # the queue is empty: another tune sharing the study took the rest
            trial.study.stop()
            raise TrialFailed("no queued candidate left")
        trial.set_user_attr("predicted_step_s", cand.predicted_step_s)
        trial.set_user_attr("source", cand.source)
        tdir = workdir / "trials" / cand.key
        tdir.mkdir(parents=True, exist_ok=True)
        plan_path = tdir / "plan.yaml"
        write_text_atomic(plan_path, dump_yaml(plan_to_dict(cand.plan)), overwrite=True)
        remaining = cfg.budget_s - (time.monotonic() - start)

        def on_step(step: int, seconds: float) -> bool:
            trial.report(cand.tokens_per_step / max(seconds, 1e-9), step)
            return trial.should_prune()

        command = None
        if cfg.command:
            fill = {"plan": str(plan_path), "nproc": str(cand.plan.world_size),
                    "steps": str(cfg.steps), "metrics": str(tdir / "metrics.jsonl")}
            command = [part.format(**fill) for part in cfg.command]
        outcome = runner(plan_path, cand.plan.world_size, cfg.steps, tdir,
                         max(5.0, min(cfg.trial_timeout_s, remaining)), on_step, command)
        ran[0] += 1
        trial.set_user_attr("step_times_s", outcome.step_times_s)
        trial.set_user_attr("wall_s", outcome.wall_s)
        if outcome.peak_memory_bytes is not None:
            trial.set_user_attr("peak_memory_bytes", outcome.peak_memory_bytes)
        if outcome.host_load is not None:
            trial.set_user_attr("host_load", outcome.host_load)
        if on_trial:
            on_trial(cand, outcome)
        if outcome.status == "pruned":
            trial.set_user_attr("reason", outcome.reason)
            raise optuna.TrialPruned(outcome.reason)
        if outcome.status == "failed":
            trial.set_user_attr("reason", outcome.reason)
            raise TrialFailed(outcome.reason)
        assert outcome.step_time_s is not None
        trial.set_user_attr("measured_step_s", outcome.step_time_s)
        return cand.tokens_per_step / max(outcome.step_time_s, 1e-9)

    if pending:
        study.optimize(objective, n_trials=len(pending), catch=(TrialFailed,),
                       timeout=max(1.0, cfg.budget_s))
    result = TuneResult(candidates, seconds=time.monotonic() - start, stored=len(stored),
                        new=ran[0])
    latest = _latest(study)
    result.trials = [trial_row(by_key[key], latest.get(key)) for key in keys]
    done = [r for r in result.trials if r["status"] == "complete"
            and r["measured_tokens_per_s"] is not None
            and math.isfinite(r["measured_tokens_per_s"])]
    if done:
        result.best_key = max(done, key=lambda r: r["measured_tokens_per_s"])["key"]
    return result


def trial_row(cand: Candidate, t: Any) -> dict[str, Any]:
    """A candidate's row in the tune's result from its last trial `t` (a FrozenTrial; None, or
    one still queued: not run, the budget was spent first)."""
    if t is None or t.state == TrialState.WAITING:  # was shown as "interrupted"
        return {"key": cand.key, "status": "not run", "reason": "budget exhausted"}
    complete = t.state == TrialState.COMPLETE
    partial = partial_step_s(t) if t.state == TrialState.PRUNED else None
    return {
        "key": cand.key, "status": {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
                                    TrialState.FAIL: "failed"}.get(t.state, "interrupted"),
        "reason": t.user_attrs.get("reason", ""),
        "measured_step_s": t.user_attrs.get("measured_step_s") if complete else None,
        "measured_tokens_per_s": t.value if complete else None,
        # a pruned trial's median step so far (its line on stderr): not a measurement
        # calibrate may use, shown apart
        "partial_step_s": partial,
        "partial_tokens_per_s": cand.tokens_per_step / partial if partial else None,
        "predicted_step_s": cand.predicted_step_s,
        "peak_memory_bytes": t.user_attrs.get("peak_memory_bytes"),
        "steps_run": len(t.user_attrs.get("step_times_s", [])),
        # the host's CPUs and load averages around the run (runner.TrialOutcome.host_load)
        **{k: (t.user_attrs.get("host_load") or {}).get(k) for k in HOST_LOAD_KEYS},
    }


def partial_step_s(trial: Any) -> float | None:
    """The median step time a trial reported before it stopped, as TrialOutcome takes it
    (warm-up steps left out); None when it reported none."""
    times = trial.user_attrs.get("step_times_s") or []
    return TrialOutcome(status="pruned", step_times_s=list(times)).step_time_s


def run_record(cand: Candidate, trial: dict[str, Any], profile: str, device: str
               ) -> dict[str, Any]:
    """A run record `autoplan calibrate` reads; `device` is what the trial trained on
    (machine.device, which calibrate holds against the profile it fits), and the host's load
    around it where read (machine.cpu_count, load_avg_start and load_avg_end, as `autoplan
    train` writes them: calibrate warns of a run on a busy host)."""
    load = {k: trial[k] for k in HOST_LOAD_KEYS if trial.get(k) is not None}
    return {"schema_version": 1, "plan": plan_to_dict(cand.plan), "profile": profile,
            "machine": {"device": device, **load},
            "measured": {"step_time_s": trial["measured_step_s"],
                         "peak_memory_bytes": trial.get("peak_memory_bytes"),
                         "steps": trial.get("steps_run")},
            "predicted": {"step_time_s": cand.predicted_step_s,
                          "memory_total_bytes": cand.predicted_memory_bytes}}


__all__ = ["Candidate", "TuneConfig", "TuneResult", "make_candidates", "plan_from_dict",
           "run_record", "run_tune"]
