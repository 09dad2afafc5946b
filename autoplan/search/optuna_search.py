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

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from autoplan.cost.estimate import default_runtime
from autoplan.errors import ConfigError
from autoplan.plan_table import COLUMNS, EXPERT_COLUMNS
from autoplan.search.engine import Progress, SearchRequest
from autoplan.search.local_moves import failed_since_last_complete, next_move
from autoplan.search.scoring import REASON_KEYS, Scored
from autoplan.search.space import EXTRA_COLUMNS
from autoplan.search.targets import MISS_KEYS, display_value
from autoplan.search.trial_space import evaluate, suggest_layout
from autoplan.yaml_io import to_dict

log = logging.getLogger(__name__)
STORAGE_ATTEMPTS = 5
SQLITE_BUSY_TIMEOUT_S = 60.0
"""How long a worker waits for another's SQLite write lock before the storage raises."""
MAX_MOVES = 8
"""A repeated layout is replaced by a local move (local_moves.py), or a random sample when the
best layouts' neighbourhoods are explored, up to this many times in a row; then it is accepted
(and not re-scored)."""
REJECTED = 10.0
"""Constraint violation of a candidate that breaks a plan rule (worse than any miss ratio)."""
Callback = Callable[[optuna.Study, FrozenTrial], None]


def open_storage(url: str | None) -> Any:
    """None: in memory; sqlite:///x.db or another RDB URL; journal:PATH for a journal file."""
    if url is None:
        return optuna.storages.InMemoryStorage()
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = url.removeprefix("journal:").removeprefix("//")
        check_journal(path)
        try:
            return JournalStorage(JournalFileBackend(path))
        except ValueError as err:  # a damaged line further on (JSONDecodeError is one)
            raise _damaged(path, err) from None
    given, url = url, _with_driver(url)
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            if not url.startswith("sqlite"):
                return optuna.storages.RDBStorage(url)
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}})
            _serialize_sqlite(storage.engine)
            return storage
        except Exception as err:  # sqlalchemy raises many kinds
            racing = type(err).__module__.startswith("sqlalchemy")
            if attempt + 1 < STORAGE_ATTEMPTS and racing:
                # workers creating a fresh SQLite schema at once race; the loser retries
                time.sleep(0.2 * (attempt + 1))
                continue
            raise ConfigError("--storage", f"cannot open {shown_url(given)!r} ({_reason(err)})",
                              "use sqlite:///PATH.db, an RDB URL, or journal:PATH") from None
    raise AssertionError("unreachable")


def shown_url(url: str) -> str:
    """The storage URL as the user gave it, with any password masked (it ends up in logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy can parse: nothing in it to recognise as a password
        return url


def _reason(err: Exception) -> str:
    """The error's kind and the driver's first line (e.g. 'connection refused', 'database
    "x" does not exist'), which says what to fix; at most 160 characters."""
    cause = getattr(err, "orig", None) or err
    first = (str(cause).strip().splitlines() or [""])[0][:160]
    return f"{err.__class__.__name__}: {first}" if first else err.__class__.__name__


def check_journal(path: str) -> None:
    """Refuse, before Optuna appends to it, a file that is not an Optuna journal: every whole
    line must be a JSON object with an `op_code` (a last line without its newline may be a
    write in progress). An absent or empty file is a new journal."""
    fix = "give a new file or a journal an earlier search or tune wrote"
    try:
        with open(path, "rb") as fh:
            first = fh.read(1)
            if first and first != b"{":
                raise ConfigError("--storage", f"{path!r} is not an Optuna journal "
                                  "(line 1 is not a journal entry)", fix)
            fh.seek(0)
            for number, line in enumerate(fh, 1):
                if not line.endswith(b"\n"):
                    break
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = None
                if not isinstance(entry, dict) or "op_code" not in entry:
                    raise ConfigError("--storage", f"{path!r} is not an Optuna journal "
                                      f"(line {number} is not a journal entry)", fix)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise ConfigError("--storage", f"{path!r} is a directory",
                          "write journal:PATH naming a file") from None
    except OSError as err:
        raise ConfigError("--storage", f"cannot read {path!r} ({err.strerror})", fix) from None


def _damaged(path: str, err: Exception) -> ConfigError:
    return ConfigError("--storage", f"the journal {path!r} cannot be read "
                       f"({err.__class__.__name__}: {str(err)[:80]})",
                       "give a new file, or repair the journal")


def _with_driver(url: str) -> str:
    """postgresql://... with the driver that is installed: SQLAlchemy's default for the plain
    scheme is psycopg 3 from 2.1 on and psycopg2 before; either works for Optuna."""
    import importlib.util

    if not url.startswith("postgresql://"):
        return url
    for module, scheme in (("psycopg", "postgresql+psycopg://"),
                           ("psycopg2", "postgresql+psycopg2://")):
        if importlib.util.find_spec(module) is not None:
            return scheme + url.removeprefix("postgresql://")
    raise ConfigError("--storage", f"{shown_url(url)!r} needs a PostgreSQL driver",
                      "pip install 'psycopg[binary]'")


def _serialize_sqlite(engine: Any) -> None:
    """Make every SQLite transaction take the write lock when it begins (BEGIN IMMEDIATE).

    Optuna pops a queued trial by reading it WAITING and then writing RUNNING in one transaction,
    with SELECT ... FOR UPDATE, which SQLite ignores; pysqlite's deferred BEGIN lets two workers
    both read WAITING, both claim the trial, and the second to tell meets "Cannot tell a COMPLETE
    trial". BEGIN IMMEDIATE makes the read and the write one step across processes. The recipe is
    SQLAlchemy's ("Serializable isolation / Savepoints / Transactional DDL", SQLite dialect docs).
    PostgreSQL and MySQL lock the row themselves.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite issues no BEGIN of its own

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while creating the schema predate the listeners


def content_hash(obj: Any) -> str:
    """SHA-256 of an object's canonical JSON (dataclasses and enums as YAML writes them, keys
    sorted): the same in every process, unlike Python's hash()."""
    text = json.dumps(to_dict(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _fingerprint(req: SearchRequest, sampler: str) -> str:
    """Everything the stored records depend on: a study resumes only under the same request.
    The profile and the runtime traits are hashed by content, so a recalibrated or edited
    profile under the same name (or path) does not mix its results with the old ones."""
    runtime = req.runtime or default_runtime(req.profile)
    fields: dict[str, Any] = {
        "model": req.model, "profile": req.profile_ref, "gpu_counts": req.gpu_counts,
        "profile_sha256": content_hash(req.profile),
        "global_batch_size": req.global_batch_size, "space": req.space.summary(),
        "targets": req.targets, "sampler": sampler, "seed": req.seed,
        "runtime": runtime.name, "runtime_sha256": content_hash(runtime),
    }
    if req.global_batch_size_max is not None:
        fields["global_batch_size_max"] = req.global_batch_size_max
    return json.dumps(to_dict(fields), sort_keys=True, default=str)


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


def claim_study(study: optuna.Study, kind: str, directions: list[str]) -> None:
    """Refuse, in one line, a study another kind made (a search's study resumed by a tune, or
    the reverse) or one optimising in other directions; mark a new study with its kind.
    Studies made before the mark are known by their fingerprint attribute; one with trials
    and neither was made by something else."""
    name = study.study_name
    attrs = study.user_attrs
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
    if KIND_ATTR not in attrs:
        study.set_user_attr(KIND_ATTR, kind)


def open_study(req: SearchRequest, sampler: str) -> optuna.Study:
    if req.storage and not req.study:
        raise ConfigError("--study", "missing", "name the study to create or resume")
    storage = open_storage(req.storage)
    fp = _fingerprint(req, sampler)
    with warnings.catch_warnings(), _journal_errors(req.storage):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(storage=storage, study_name=req.study, load_if_exists=True,
                                    directions=_directions(req))
    claim_study(study, "search", _directions(req))
    have = study.user_attrs.get(FINGERPRINT_ATTRS["search"])
    if have is None:
        study.set_user_attr(FINGERPRINT_ATTRS["search"], fp)
    elif have != fp:
        raise ConfigError("--study", f"{req.study!r} was created by a different search",
                          "rerun that exact command, or use another --study name")
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


@contextmanager
def _journal_errors(url: str | None) -> Iterator[None]:
    """A journal line damaged while a study is open (another writer) as one ConfigError."""
    try:
        yield
    except ValueError as err:
        journal = bool(url) and str(url).startswith("journal:")
        if not journal or not (isinstance(err, json.JSONDecodeError)
                               or str(err) == "Invalid log format."):
            raise
        raise _damaged(str(url).removeprefix("journal:").removeprefix("//"), err) from None


def run_optuna(req: SearchRequest, sampler: str, progress: Progress | None = None,
               callbacks: Sequence[Callback] = ()) -> tuple[Scored, int]:
    """Run trials until the study holds `req.trials` complete ones; rebuild the scored set."""
    if req.trials < 1:
        raise ConfigError("--trials", f"got {req.trials}", "expected a positive integer")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with _journal_errors(req.storage):
        return _run_trials(req, sampler, progress, callbacks)


def _run_trials(req: SearchRequest, sampler: str, progress: Progress | None,
                callbacks: Sequence[Callback]) -> tuple[Scored, int]:
    study = open_study(req, sampler)
    cache = {_key(t.user_attrs["record"]): t.user_attrs["record"] for t in _finished(study)}
    local_retry = 0
    if req.storage:
        _recover_move(study, req, len(_finished(study)))
    done = len(_finished(study))
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
        done, local_retry = len(_finished(study)), 0
        if progress:
            progress("trials", min(done, req.trials), req.trials)
        for cb in callbacks:
            cb(study, frozen)
    return collect(study, req), done


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
    return Scored(cols, counts, runtime)


def _empty(counts: dict[str, int], runtime: str) -> Scored:
    cols: dict[str, np.ndarray] = {
        k: np.zeros(0, dtype=dt) for k, dt in {**COLUMNS, **EXTRA_COLUMNS,
                                               **EXPERT_COLUMNS}.items()}
    for k in ("tokens_per_s", "time_step", "mem_total", "mem_host", "trial", "seq"):
        cols[k] = np.zeros(0)
    cols["miss"] = np.zeros((0, len(MISS_KEYS)))
    cols["objectives"] = np.zeros((0, 1))
    cols["reason"] = np.zeros(0, dtype=np.int64)
    cols["dominant"] = np.zeros(0, dtype=np.int64)
    return Scored(cols, counts, runtime)
