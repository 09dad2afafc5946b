"""Optuna search for spaces too large to enumerate: GPU-count choice, balanced (uneven) layer
splits, and every knob of the space, scored by the same code as the exhaustive search (what a
trial chooses is in `trial_space`).

Reproducible and resumable: trial k (k = trials already complete, r = repeats rejected since) is
sampled by a fresh sampler seeded with (seed, worker, k, r) from the completed history alone
(constant_liar off); a repeated layout is replaced by a local move (local_moves.py). Everything
that steers the next sample is read back from storage, so a search killed halfway and rerun
continues exactly where an uninterrupted run would be. Results live in each trial's user
attributes and are never re-scored.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from autoplan.cost.error_band import band_and_bias_of_table, mfu_ceiling_array
from autoplan.cost.estimate import default_runtime
from autoplan.errors import ConfigError
from autoplan.plan_table import COLUMNS, EXPERT_COLUMNS
from autoplan.search.engine import Progress, SearchRequest, StudyCount
from autoplan.search.fingerprint import (
    PROFILE_ATTR,
    Stored,
    cluster_that_resumes,
    fingerprint,
    mismatch,
    profile_record,
    request_changes,
)
from autoplan.search.fingerprint import (  # where tune and stored tests import them from
    RUNTIME_OMITTED_AT_DEFAULT as RUNTIME_OMITTED_AT_DEFAULT,
)
from autoplan.search.fingerprint import content_hash as content_hash
from autoplan.search.fingerprint import fingerprint as _fingerprint  # noqa: F401
from autoplan.search.fingerprint import mismatch as _mismatch  # noqa: F401
from autoplan.search.fingerprint import model_hash as model_hash
from autoplan.search.fingerprint import profile_hash as profile_hash
from autoplan.search.fingerprint import runtime_hash as runtime_hash
from autoplan.search.local_moves import failed_since_last_complete, next_move
from autoplan.search.scoring import REASON_KEYS, Scored
from autoplan.search.space import EXTRA_COLUMNS
from autoplan.search.storage import check_study_name, journal_errors, open_storage, storage_errors
from autoplan.search.targets import MISS_KEYS, display_value
from autoplan.search.trial_space import evaluate, suggest_layout

log = logging.getLogger(__name__)
OWNER_WAIT_S = 30.0
"""How long a process that found a study another one has just created waits for its maker to
mark it (kind and request); one still unmarked then, with no trials, is taken over (its maker
died before marking it)."""
OWNER_POLL_S = 0.1
MAX_MOVES = 8
"""A repeated layout is replaced by a local move (local_moves.py), or a random sample when the
best layouts' neighbourhoods are explored, up to this many times in a row; then it is accepted
(and not re-scored)."""
REJECTED = 10.0
"""Constraint violation of a candidate that breaks a plan rule (worse than any miss ratio)."""
Callback = Callable[[optuna.Study, FrozenTrial], None]


def _directions(req: SearchRequest) -> list[Any]:
    return ["maximize" if o == "throughput" else "minimize" for o in req.targets.objectives]


def _constraints(trial: FrozenTrial) -> Sequence[float]:
    return trial.user_attrs["constraints"]


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    # constraints_func (one storage write per trial) rather than Optuna 5's Trial.set_constraint
    # (one write per constraint, which dominates a trial on SQLite); deprecated, not removed < 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=False,
                n_startup_trials=min(20, max(5, trials // 10)), constraints_func=_constraints)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=seed, population_size=min(50, max(10, trials // 10)),
                constraints_func=_constraints)
        return optuna.samplers.RandomSampler(seed=seed)


def _key(rec: dict[str, Any]) -> str:
    return json.dumps(rec["layout"], sort_keys=True)


def _values_and_constraints(rec: dict[str, Any], req: SearchRequest) -> tuple[list[float],
                                                                               list[float]]:
    objs = req.targets.objectives
    if "rejected" in rec:
        worst = [0.0 if o == "throughput" else 1e30 for o in objs]
        return worst, [REJECTED] * (1 + len(MISS_KEYS))
    values = [display_value(o, float(v)) for o, v in zip(objs, rec["objectives"], strict=True)]
    miss = [float(min(max(m, -1.0), 1e6)) for m in rec["miss"]]
    return values, [0.0, *miss]


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


KIND_ATTR = "autoplan_kind"
"""Study user attribute naming what made the study: "search" or "tune" (they share storages)."""
FINGERPRINT_ATTRS = {"search": "autoplan_request", "tune": "autoplan_tune"}
"""The user attribute each kind keeps its request fingerprint in."""


def create_or_load(storage: Any, name: str | None, directions: list[Any]
                   ) -> tuple[optuna.Study, bool]:
    """The study, and whether this call created it: of several processes opening a new name at
    once exactly one creates it (the others meet DuplicatedStudyError and load it), so exactly
    one may mark it with its request."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return optuna.create_study(storage=storage, study_name=name, load_if_exists=False,
                                       directions=directions), True
        except optuna.exceptions.DuplicatedStudyError:
            return optuna.load_study(study_name=name, storage=storage), False


def _marked(attrs: dict[str, Any]) -> bool:
    return KIND_ATTR in attrs or any(a in attrs for a in FINGERPRINT_ATTRS.values())


def _wait_for_mark(study: optuna.Study) -> dict[str, Any]:
    """The study's attributes once its maker has marked it, or as they are after OWNER_WAIT_S
    (a study already marked returns at once)."""
    deadline = time.monotonic() + OWNER_WAIT_S
    while True:
        attrs = study.user_attrs
        if _marked(attrs) or time.monotonic() >= deadline:
            return attrs
        time.sleep(OWNER_POLL_S)


def claim_study(study: optuna.Study, kind: str, directions: list[str],
                created: bool | None = None) -> None:
    """Refuse, in one line, a study another kind made (a search's study resumed by a tune, or
    the reverse) or one optimising in other directions; mark a new study with its kind.
    Studies made before the mark are known by their fingerprint attribute; one with trials
    and neither was made by something else. `created` (from create_or_load): True marks the
    study without reading it; False first waits for its maker's mark; None (a caller that
    cannot tell) marks it when it finds none."""
    if created:
        study.set_user_attr(KIND_ATTR, kind)
        return
    attrs = study.user_attrs if created is None else _wait_for_mark(study)
    check_claim(study, kind, directions, attrs)
    if KIND_ATTR not in attrs:
        study.set_user_attr(KIND_ATTR, kind)


def check_claim(study: optuna.Study, kind: str, directions: list[str],
                attrs: dict[str, Any]) -> None:
    """What claim_study refuses, judged on the study's attributes `attrs` without writing:
    a study another kind made, one with trials nothing of autoplan's marked, one optimising
    in other directions."""
    name = study.study_name
    have = attrs.get(KIND_ATTR) or next(
        (k for k, attr in FINGERPRINT_ATTRS.items() if attr in attrs), None)
    if have is None and study.get_trials(deepcopy=False):
        raise ConfigError("--study", f"{name!r} holds trials no autoplan {kind} recorded (an "
                          "older autoplan or another program made it)",
                          "use another --study name")
    if have is not None and have != kind:
        raise ConfigError("--study", f"{name!r} is an autoplan {have} study; an autoplan "
                          f"{kind} cannot resume it", "use another --study name")
    got = [d.name.lower() for d in study.directions]
    if got != directions:
        raise ConfigError("--study", f"{name!r} optimises other objectives ({', '.join(got)}; "
                          f"this {kind} needs {', '.join(directions)})",
                          "use another --study name")


def open_study(req: SearchRequest, sampler: str) -> optuna.Study:
    """Create the study and mark it with this request, or resume one marked with the same
    request. Only the process that created it marks it (request first, then kind), so two
    first runs with different requests on one name cannot both pass: the other waits for the
    mark and is refused."""
    if req.storage and not req.study:
        raise ConfigError("--study", "missing", "name the study to create or resume")
    check_study_name(req.study)
    storage = open_storage(req.storage)
    fp, attr = fingerprint(req, sampler), FINGERPRINT_ATTRS["search"]
    profile = profile_record(req.profile, req.profile_ref)
    with journal_errors(req.storage):
        study, created = create_or_load(storage, req.study, _directions(req))
    if created:  # the profile first: a process waiting for the mark then finds it too
        study.set_user_attr(PROFILE_ATTR, profile)
        study.set_user_attr(attr, fp)
        claim_study(study, "search", _directions(req), created=True)
        return study
    claim_study(study, "search", _directions(req), created=False)
    attrs = study.user_attrs
    have = attrs.get(attr)
    if have is None:  # a study its maker never marked (it died first), without trials
        study.set_user_attr(PROFILE_ATTR, profile)
        study.set_user_attr(attr, fp)
        return study
    stored = Stored(have, attrs.get(PROFILE_ATTR))
    changes = request_changes(stored, fp, profile)
    if changes:
        given = req.space_given or req.space
        raise mismatch(req.study, changes, auto_precision=not given.precision,
                       auto_attention=not given.attention,
                       cluster=cluster_that_resumes(req, sampler, stored))
    if stored.profile is None and have == fp:  # stored before the record: the same profile
        study.set_user_attr(PROFILE_ATTR, profile)
    return study


def _seed(req: SearchRequest, done: int, retry: int) -> int:
    return int(np.random.SeedSequence([req.seed, req.worker, done, retry]).generate_state(1)[0])


def _recover_move(study: optuna.Study, req: SearchRequest, done: int) -> None:
    """Restore the local move a killed run was about to make, so the resumed search takes the
    same path: re-queue a move that was being scored, or queue the one a repeat had earned."""
    trials = study.get_trials(deepcopy=False)
    if not trials or any(t.state == TrialState.WAITING for t in trials):
        return
    last = max(trials, key=lambda t: t.number)
    if last.state == TrialState.RUNNING and "fixed_params" in last.system_attrs:
        study.enqueue_trial(last.system_attrs["fixed_params"])
    elif last.state == TrialState.FAIL:
        retry = failed_since_last_complete(study) - 1
        move = next_move(study, np.random.default_rng(_seed(req, done, retry)))
        if move is not None:
            study.enqueue_trial(move)


def run_optuna(req: SearchRequest, sampler: str, progress: Progress | None = None,
               callbacks: Sequence[Callback] = ()) -> tuple[Scored, int, StudyCount | None]:
    """Run trials until the study holds `req.trials` complete ones; rebuild the scored set.
    With --storage, also what the study held, what this process added and what it holds now
    (None in memory)."""
    if req.trials < 1:
        raise ConfigError("--trials", f"got {req.trials}", "expected a positive integer")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with journal_errors(req.storage), storage_errors(req.storage):
        return _run_trials(req, sampler, progress, callbacks)


def _run_trials(req: SearchRequest, sampler: str, progress: Progress | None,
                callbacks: Sequence[Callback]) -> tuple[Scored, int, StudyCount | None]:
    """The sampling loop. Workers sharing a study each stop once it holds req.trials, but
    finish the trial they have in flight: N workers may end it up to N - 1 past req.trials,
    as with Optuna's MaxTrialsCallback (optuna/optuna#3518)."""
    study = open_study(req, sampler)
    finished = _finished(study)
    cache = {_key(t.user_attrs["record"]): t.user_attrs["record"] for t in finished}
    local_retry, added, stored = 0, 0, len(finished)
    if req.storage:
        _recover_move(study, req, stored)
    done = stored
    while done < req.trials:
        retry = failed_since_last_complete(study) if req.storage else local_retry
        seed = _seed(req, done, retry)
        # after a repeat: a queued local move (its new knobs filled at random) or a random sample
        study.sampler = make_sampler(sampler if retry == 0 else "random", seed, req.trials)
        trial = study.ask()  # an enqueued local move comes out first
        # an exception (Ctrl-C, kill) leaves this trial RUNNING, like SIGKILL would: samplers
        # ignore it and _recover_move re-queues it if it was a local move
        try:  # two workers can pop the same queued move; the slower one moves on
            layout = suggest_layout(trial, req)
            key = json.dumps(layout, sort_keys=True)
            if key in cache and layout is not None and retry < MAX_MOVES:
                study.tell(trial, state=TrialState.FAIL)  # samplers ignore failed trials
                move = next_move(study, np.random.default_rng(seed))
                if move is not None:
                    study.enqueue_trial(move)
                local_retry = retry + 1
                continue
            if key not in cache:  # a layout sampled again (after the retries) is not re-scored
                cache[key] = evaluate(layout, req)
            rec = {k: v for k, v in cache[key].items() if k != "seq"}
            values, cons = _values_and_constraints(rec, req)
            trial.set_user_attr("record", {**rec, "seq": done})
            trial.set_user_attr("constraints", cons)
            frozen = study.tell(trial, values)
        except optuna.exceptions.UpdateFinishedTrialError:
            log.info("trial %d was finished by another worker; moving on", trial.number)
            continue
        done, local_retry, added = len(_finished(study)), 0, added + 1
        if progress:
            progress("trials", min(done, req.trials), req.trials)
        for cb in callbacks:
            cb(study, frozen)
    count = None
    if req.storage:  # read again: workers sharing the study may have added trials since
        count = StudyCount(str(req.study), stored, added, len(_finished(study)))
    return collect(study, req), done, count


def collect(study: optuna.Study, req: SearchRequest) -> Scored:
    """The scored set from the study's stored records (no re-scoring); the same plan sampled
    twice is kept once, at its first trial. Column `seq` numbers the complete trials 0, 1, ...
    in the order they were sampled; `trial` is Optuna's trial number."""
    counts = dict.fromkeys((*REASON_KEYS, "feasible"), 0)
    trials = sorted(_finished(study), key=lambda t: (t.user_attrs["record"]["seq"], t.number))
    records, seen = [], set()
    for t in trials:
        rec = t.user_attrs["record"]
        if "rejected" in rec:
            counts[rec["rejected"]] += 1
            continue
        key = _key(rec)
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        counts[MISS_KEYS[rec["reason"]] if rec["reason"] >= 0 else "feasible"] += 1
        records.append({**rec, "trial": t.number})
    cols: dict[str, np.ndarray] = {}
    runtime = (req.runtime or default_runtime(req.profile)).name
    if not records:
        return _empty(counts, runtime)
    for k in records[0]:
        if k not in ("layout", "variants"):
            cols[k] = np.array([r[k] for r in records])
    for k, dt in {**COLUMNS, **EXTRA_COLUMNS}.items():
        cols[k] = cols[k].astype(dt)
    for k, dt in EXPERT_COLUMNS.items():  # records stored before ep was searched have none
        cols[k] = cols[k].astype(dt) if k in cols else np.ones(len(records), dtype=dt)
    validation_columns(req, cols)
    return Scored(cols, counts, runtime)


def validation_columns(req: SearchRequest, cols: dict[str, np.ndarray]) -> None:
    """Each row's error band, bias and MFU ceiling from its layout and precision and today's
    error_bands.yaml, as estimate_table gives them to the rows it scores: a record stores the
    band it was scored with (and no ceiling, trial_space.evaluate), so a study resumed after
    the bands were regenerated would rank rows under two sets of them."""
    traits = req.runtime or default_runtime(req.profile)
    name, moe = traits.base or traits.name, req.model.moe is not None
    n = len(cols["tp"])
    band, bias, ceiling = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    for code in np.unique(cols["precision"]):
        at = cols["precision"] == code
        precision = req.space.precision[code].value
        tp, pp, cp = cols["tp"][at], cols["pp"][at], cols["cp"][at]
        rows = _Layout(tp, pp, cp, cols["num_gpus"][at])
        band[at], bias[at] = band_and_bias_of_table(name, rows, req.profile, moe,  # type: ignore[arg-type]
                                                    precision)
        ceiling[at] = mfu_ceiling_array(name, tp, pp, cp, req.profile, precision, moe,
                                        req.model.seq_len)
    cols["band"], cols["bias"], cols["mfu_ceiling"] = band, bias, ceiling


class _Layout:
    """The columns band_and_bias_of_table reads of a Rows (tp, pp, cp, world)."""

    def __init__(self, tp: np.ndarray, pp: np.ndarray, cp: np.ndarray, world: np.ndarray):
        self.tp, self.pp, self.cp, self.world = tp, pp, cp, world


def _empty(counts: dict[str, int], runtime: str) -> Scored:
    cols: dict[str, np.ndarray] = {
        k: np.zeros(0, dtype=dt) for k, dt in {**COLUMNS, **EXTRA_COLUMNS,
                                               **EXPERT_COLUMNS}.items()}
    for k in ("tokens_per_s", "time_step", "mem_total", "mem_allocator", "mem_host", "trial",
              "seq"):
        cols[k] = np.zeros(0)
    cols["miss"] = np.zeros((0, len(MISS_KEYS)))
    cols["objectives"] = np.zeros((0, 1))
    cols["reason"] = np.zeros(0, dtype=np.int64)
    cols["dominant"] = np.zeros(0, dtype=np.int64)
    return Scored(cols, counts, runtime)
