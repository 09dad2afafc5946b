"""Optuna search for spaces too large to enumerate: GPU-count choice, balanced (uneven) layer
splits, and every knob of the space, scored by the same code as the exhaustive search.

Reproducible and resumable: trial k (k = trials already complete) is sampled by a fresh sampler
seeded with (seed, worker, k) from the completed history alone (constant_liar off), so a search
killed halfway and rerun on the same storage continues exactly where an uninterrupted run would
be. Results live in each trial's user attributes and are never re-scored.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from autoplan.errors import ConfigError
from autoplan.plan import RecomputePolicy, Schedule
from autoplan.plan_table import COLUMNS, INTERLEAVED, RECOMPUTE, SCHEDULES, ZERO_BUBBLE
from autoplan.search.engine import Progress, SearchRequest
from autoplan.search.partition import split_columns
from autoplan.search.scoring import REASON_KEYS, Scored, canonical_schedule, score_table
from autoplan.search.space import EXTRA_COLUMNS
from autoplan.search.targets import MISS_KEYS, display_value
from autoplan.search_space import Split
from autoplan.yaml_io import to_dict

log = logging.getLogger(__name__)
HAS_SET_CONSTRAINT = hasattr(Trial, "set_constraint")
"""Optuna 5 takes constraints from the trial; Optuna 4 from the sampler's constraints_func."""
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
        return JournalStorage(JournalFileBackend(path))
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # sqlalchemy raises many kinds
        raise ConfigError("--storage", f"cannot open {url!r} ({err.__class__.__name__})",
                          "use sqlite:///PATH.db, an RDB URL, or journal:PATH") from None


def _fingerprint(req: SearchRequest, sampler: str) -> str:
    return json.dumps(to_dict({
        "model": req.model, "profile": req.profile_ref, "gpu_counts": req.gpu_counts,
        "global_batch_size": req.global_batch_size, "space": req.space.summary(),
        "targets": req.targets, "sampler": sampler, "seed": req.seed,
    }), sort_keys=True, default=str)


def _directions(req: SearchRequest) -> list[str]:
    return ["maximize" if o == "throughput" else "minimize" for o in req.targets.objectives]


def _constraints(trial: FrozenTrial) -> Sequence[float]:
    return trial.user_attrs["constraints"]


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    cons = {} if HAS_SET_CONSTRAINT else {"constraints_func": _constraints}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=False,
                n_startup_trials=min(20, max(5, trials // 10)), **cons)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=seed, population_size=min(50, max(10, trials // 10)), **cons)
        return optuna.samplers.RandomSampler(seed=seed)


def _pick(trial: Trial, name: str, values: Sequence[Any], relevant: bool, default: Any) -> Any:
    """Suggest a knob only where it matters; elsewhere use its no-op value if the space has it."""
    values = list(values)
    if not relevant and default in values:
        return default
    if len(values) == 1:
        return values[0]
    return trial.suggest_categorical(name, values)


def suggest(trial: Trial, req: SearchRequest) -> dict[str, Any] | None:
    """One candidate row from the trial's choices; None when tp*pp*cp cannot fill the GPUs."""
    sp, par = req.space, req.space.parallel
    n = _pick(trial, "num_gpus", req.gpu_counts, True, None)
    tp, pp, cp = (_pick(trial, k, getattr(par, k), True, None) for k in ("tp", "pp", "cp"))
    if n % (tp * pp * cp) or (par.dp is not None and n // (tp * pp * cp) not in par.dp):
        return None
    sched_values = [s.value for s in sp.pipeline.schedule]
    schedule = _pick(trial, "schedule", sched_values, pp > 1,
                     SCHEDULES[canonical_schedule(sp)].value)
    code = SCHEDULES.index(Schedule(schedule))
    vpp = _pick(trial, "vpp", sp.pipeline.vpp, pp > 1 and code in (INTERLEAVED, ZERO_BUBBLE), 1)
    split = _pick(trial, "split", [s.value for s in sp.pipeline.split], pp > 1, "even")
    zero = _pick(trial, "zero_stage", sp.zero_stage, True, None)
    policy = _pick(trial, "recompute", [p.value for p in sp.recompute.policy], True, None)
    rcl = _pick(trial, "recompute_layers", sp.recompute.num_layers,
                policy != RecomputePolicy.NONE.value, None)
    row = {
        "num_gpus": n, "dp": n // (tp * pp * cp), "tp": tp, "pp": pp, "cp": cp, "vpp": vpp,
        "sp": _pick(trial, "sp", sp.sequence_parallel, tp > 1, False),
        "schedule": code, "zero_stage": zero,
        "offload_optimizer": _pick(trial, "offload_optimizer", sp.offload.optimizer,
                                   zero >= 1, False),
        "offload_params": _pick(trial, "offload_params", sp.offload.params, zero == 3, False),
        "recompute": RECOMPUTE.index(RecomputePolicy(policy)),
        "recompute_layers": -1 if policy == RecomputePolicy.NONE.value or rcl is None else rcl,
        "mbs": _pick(trial, "mbs", sp.micro_batch_size, True, None),
        "gbs": req.global_batch_size,
        "precision": sp.precision.index(_pick(trial, "precision", sp.precision, True, None)),
        "attention": sp.attention.index(_pick(trial, "attention", sp.attention, True, None)),
        "split": list(Split).index(Split(split)),
    }
    layers = -(-req.model.num_layers // pp)
    cols = split_columns(req.model, pp, vpp) if split == Split.BALANCED.value else None
    if cols is None:
        row["split"] = 0
        cols = (layers, layers, layers)
    row["layers_first"], row["layers_max"], row["layers_last"] = cols
    return row


def _evaluate(row: dict[str, Any] | None, req: SearchRequest) -> dict[str, Any]:
    """Score one row; the record stored on the trial (plain JSON values)."""
    if row is None:
        return {"rejected": "world-size"}
    dtypes = {**COLUMNS, **EXTRA_COLUMNS}
    table = {k: np.array([row[k]], dtype=dtypes[k]) for k in dtypes}
    scored = score_table(table, req.context(), dedupe=False)
    if scored.n == 0:
        key = next(k for k in REASON_KEYS if scored.counts[k])
        return {"rejected": key, "params": row}
    rec: dict[str, Any] = {}
    for k, v in scored.cols.items():
        v = np.asarray(v)[0]
        rec[k] = v.tolist()
    return rec


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


def open_study(req: SearchRequest, sampler: str) -> optuna.Study:
    if req.storage and not req.study:
        raise ConfigError("--study", "missing", "name the study to create or resume")
    storage = open_storage(req.storage)
    fp = _fingerprint(req, sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(storage=storage, study_name=req.study, load_if_exists=True,
                                    directions=_directions(req))
    if [d.name.lower() for d in study.directions] != _directions(req):
        raise ConfigError("--study", f"{req.study!r} optimises other objectives",
                          "use another --study name")
    have = study.user_attrs.get("autoplan_request")
    if have is None:
        study.set_user_attr("autoplan_request", fp)
    elif have != fp:
        raise ConfigError("--study", f"{req.study!r} was created by a different search",
                          "rerun that exact command, or use another --study name")
    return study


def run_optuna(req: SearchRequest, sampler: str, progress: Progress | None = None,
               callbacks: Sequence[Callback] = ()) -> tuple[Scored, int]:
    """Run trials until the study holds `req.trials` complete ones; rebuild the scored set."""
    if req.trials < 1:
        raise ConfigError("--trials", f"got {req.trials}", "expected a positive integer")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(req, sampler)
    cache: dict[str, dict[str, Any]] = {}
    done = len(_finished(study))
    while done < req.trials:
        seed = int(np.random.SeedSequence([req.seed, req.worker, done]).generate_state(1)[0])
        study.sampler = make_sampler(sampler, seed, req.trials)
        trial = study.ask()
        try:
            row = suggest(trial, req)
            key = json.dumps(row, sort_keys=True)
            rec = cache.get(key) or _evaluate(row, req)
            cache[key] = rec
            values, cons = _values_and_constraints(rec, req)
            trial.set_user_attr("record", {**rec, "seq": done})
            trial.set_user_attr("constraints", cons)
            if HAS_SET_CONSTRAINT:
                for name, value in zip(("rule", *MISS_KEYS), cons, strict=True):
                    trial.set_constraint(name, value)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        frozen = study.tell(trial, values)
        done = len(_finished(study))
        if progress:
            progress("trials", min(done, req.trials), req.trials)
        for cb in callbacks:
            cb(study, frozen)
    return collect(study, req), done


def collect(study: optuna.Study, req: SearchRequest) -> Scored:
    """The scored set from the study's stored records (no re-scoring); the same plan sampled
    twice is kept once, at its first trial."""
    counts = dict.fromkeys((*REASON_KEYS, "feasible"), 0)
    trials = sorted(_finished(study), key=lambda t: (t.user_attrs["record"]["seq"], t.number))
    records, seen = [], set()
    for t in trials:
        rec = t.user_attrs["record"]
        if "rejected" in rec:
            counts[rec["rejected"]] += 1
            continue
        key = tuple(rec[k] for k in (*COLUMNS, *EXTRA_COLUMNS))
        if key in seen:
            continue
        seen.add(key)
        counts[MISS_KEYS[rec["reason"]] if rec["reason"] >= 0 else "feasible"] += 1
        records.append({**rec, "trial": t.number})
    cols: dict[str, np.ndarray] = {}
    if records:
        for k in records[0]:
            if k == "seq":
                continue
            cols[k] = np.array([r[k] for r in records])
    else:
        empty = Scored({}, {})
        return _empty(empty, counts)
    dtypes = {**COLUMNS, **EXTRA_COLUMNS}
    for k, dt in dtypes.items():
        cols[k] = cols[k].astype(dt)
    return Scored(cols, counts)


def _empty(_: Scored, counts: dict[str, int]) -> Scored:
    cols: dict[str, np.ndarray] = {k: np.zeros(0, dtype=dt)
                                   for k, dt in {**COLUMNS, **EXTRA_COLUMNS}.items()}
    for k in ("tokens_per_s", "time_step", "mem_total", "mem_host", "trial"):
        cols[k] = np.zeros(0)
    cols["miss"] = np.zeros((0, len(MISS_KEYS)))
    cols["objectives"] = np.zeros((0, 1))
    cols["reason"] = np.zeros(0, dtype=np.int64)
    cols["dominant"] = np.zeros(0, dtype=np.int64)
    return Scored(cols, counts)
