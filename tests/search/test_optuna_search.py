"""Optuna search: seeded runs repeat, an interrupted study resumes to the same ranking (both a
callback that raises mid-search and a process killed with SIGKILL), storages and mismatches."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autoplan.errors import ConfigError
from autoplan.search.engine import run_search
from autoplan.search.optuna_search import open_study, run_optuna
from autoplan.search.targets import Targets
from tests.search.conftest import SMALL_SPACE, request

TRIALS = 30


class Stop(Exception):
    pass


def stop_after(n: int):
    def cb(study, trial) -> None:
        if len(study.get_trials(deepcopy=False, states=(trial.state,))) >= n:
            raise Stop

    return cb


def ranking(result) -> list[tuple]:
    c = result.scored.cols
    keys = ("num_gpus", "dp", "tp", "pp", "sp", "schedule", "vpp", "split", "zero_stage",
            "recompute", "recompute_layers", "mbs", "attention")
    return [tuple(int(c[k][i]) for k in keys) + (float(c["tokens_per_s"][i]),)
            for i in result.order]


def trial_params(study) -> list[dict]:
    return [t.params for t in sorted(study.trials, key=lambda t: t.number)
            if t.state.name == "COMPLETE"]


def test_seeded_runs_repeat_and_seeds_differ() -> None:
    req = request(sampler="tpe", trials=30, seed=3)
    a, b = run_search(req), run_search(req)
    assert ranking(a) == ranking(b)
    c = run_search(dataclasses.replace(req, seed=4))
    assert ranking(c) != ranking(a)


def test_resume_after_interrupt_equals_uninterrupted(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'study.db'}"
    base = request(sampler="tpe", trials=TRIALS, seed=7, storage=db)
    full = run_search(dataclasses.replace(base, study="full"))
    part = dataclasses.replace(base, study="part")
    with pytest.raises(Stop):
        run_optuna(part, "tpe", callbacks=[stop_after(12)])
    study = open_study(part, "tpe")
    assert len(trial_params(study)) == 12
    scored_before = {t.number: t.user_attrs["record"] for t in study.trials
                     if t.state.name == "COMPLETE"}
    resumed = run_search(part)
    study = open_study(part, "tpe")
    assert len(trial_params(study)) == TRIALS
    assert trial_params(study) == trial_params(open_study(dataclasses.replace(base, study="full"),
                                                          "tpe"))
    for number, rec in scored_before.items():  # finished trials were not re-scored
        assert study.trials[number].user_attrs["record"] == rec
    assert ranking(resumed) == ranking(full)


def _db_complete(path: Path) -> int:
    try:
        with sqlite3.connect(path) as con:
            return con.execute("select count(*) from trials where state='COMPLETE'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_resume_after_sigkill_equals_uninterrupted(tmp_path: Path, space_file) -> None:
    space = space_file(SMALL_SPACE)
    cmd = [sys.executable, "-m", "autoplan.commands", "search", "--model", "tiny", "--cluster",
           "cpu-gloo", "--num-gpus", "4", "--global-batch-size", "8", "--space", str(space),
           "--sampler", "tpe", "--trials", str(TRIALS), "--seed", "11", "--format", "json"]
    killed_db = tmp_path / "killed.db"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen(cmd + ["--storage", f"sqlite:///{killed_db}", "--study", "s"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while _db_complete(killed_db) < 12 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = _db_complete(killed_db)
    assert 0 < done < TRIALS, "the kill should land mid-search"
    out = tmp_path / "resumed"
    subprocess.run(cmd + ["--storage", f"sqlite:///{killed_db}", "--study", "s", "--out",
                          str(out)], check=True, env=env, capture_output=True)
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["--storage", f"sqlite:///{tmp_path / 'ref.db'}", "--study", "s",
                          "--out", str(ref)], check=True, env=env, capture_output=True)
    import pandas as pd

    a = pd.read_csv(out / "trials.csv.gz").drop(columns=["trial", "row"])
    b = pd.read_csv(ref / "trials.csv.gz").drop(columns=["trial", "row"])
    pd.testing.assert_frame_equal(a, b)
    assert (out / "plan.yaml").read_text() == (ref / "plan.yaml").read_text()


def test_journal_storage_resumes(tmp_path: Path) -> None:
    url = f"journal:{tmp_path / 'j.log'}"
    req = request(sampler="random", trials=12, seed=1, storage=url, study="j")
    first = run_search(req)
    again = run_search(dataclasses.replace(req, trials=20))
    assert len(ranking(again)) >= len(ranking(first))
    assert set(ranking(first)) <= set(ranking(again))


def test_study_of_another_search_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    run_search(request(sampler="tpe", trials=5, storage=db, study="x"))
    with pytest.raises(ConfigError, match="different search"):
        run_search(request(sampler="tpe", trials=5, storage=db, study="x", gbs=16))
    with pytest.raises(ConfigError, match="--study"):
        run_search(request(sampler="tpe", trials=5, storage=db))


def test_optuna_rows_score_like_the_exhaustive_search() -> None:
    ex = run_search(request(sampler="exhaustive"))
    op = run_search(request(sampler="random", trials=60, seed=2))
    key = ("num_gpus", "dp", "tp", "pp", "cp", "sp", "schedule", "vpp", "zero_stage",
           "recompute", "recompute_layers", "mbs", "attention")
    index = {tuple(int(ex.scored.cols[k][i]) for k in key): i for i in range(ex.scored.n)}
    matched = 0
    for i in range(op.scored.n):
        if int(op.scored.cols["split"][i]):
            continue
        j = index.get(tuple(int(op.scored.cols[k][i]) for k in key))
        if j is not None:
            matched += 1
            assert op.scored.cols["tokens_per_s"][i] == pytest.approx(
                ex.scored.cols["tokens_per_s"][j], rel=1e-12)
    assert matched > 10
    assert sum(op.scored.counts.values()) == 60  # every trial counted once, by its outcome


def test_multi_objective_front_is_non_dominated() -> None:
    req = request(sampler="nsga2", trials=60, gpus=(2, 4, 8), seed=0,
                  targets=Targets(("throughput", "cost")))
    res = run_search(req)
    obj = res.scored.cols["objectives"]
    front = np.flatnonzero(res.front)
    assert len(front) >= 1
    for i in front:
        others = obj[res.scored.feasible]
        assert not np.any(np.all(others <= obj[i], axis=1) & np.any(others < obj[i], axis=1))


def test_two_workers_share_one_study(tmp_path: Path, space_file) -> None:
    space = space_file(SMALL_SPACE)
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "autoplan.commands", "search", "--model", "tiny", "--cluster",
           "cpu-gloo", "--num-gpus", "2..8", "--global-batch-size", "16", "--space", str(space),
           "--sampler", "tpe", "--trials", "24", "--storage", db, "--study", "w",
           "--format", "json"]
    procs = [subprocess.Popen(cmd + ["--worker", str(w)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env) for w in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-400:] for _, e in outs]
    import json

    import optuna

    study = optuna.load_study(study_name="w", storage=db)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert 24 <= len(complete) <= 26  # each worker stops once the study holds 24
    assert len({t.user_attrs["record"]["seq"] for t in complete}) >= 12  # both made progress
    assert all(json.loads(o)["candidates"] >= 24 for o, _ in outs)


QUEUED = 100
WORKERS = 3


def _pop_queued(url: str, out: str) -> None:
    """Worker process: claim queued trials until the queue is empty; write what it claimed."""
    import json

    import optuna

    from autoplan.search.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="q", storage=open_storage(url))
    claimed, errors = [], []
    while True:
        trial = study.ask()
        if trial.number >= QUEUED:  # the queue is empty: a fresh trial
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            break
        claimed.append(trial.number)
        try:
            study.tell(trial, float(trial.number))
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as err:
            errors.append(str(err))
    Path(out).write_text(json.dumps({"claimed": claimed, "errors": errors}))


def test_workers_never_claim_one_queued_trial(tmp_path: Path) -> None:
    """The race behind "Cannot tell a COMPLETE trial": on SQLite two workers could pop the same
    queued trial (Optuna's SELECT ... FOR UPDATE is a no-op there) and the second tell failed."""
    import json
    import multiprocessing

    import optuna

    from autoplan.search.storage import open_storage

    url = f"sqlite:///{tmp_path / 'q.db'}"
    study = optuna.create_study(study_name="q", storage=open_storage(url))
    for i in range(QUEUED):
        study.enqueue_trial({"x": i})
    ctx = multiprocessing.get_context("fork")
    outs = [str(tmp_path / f"w{w}.json") for w in range(WORKERS)]
    procs = [ctx.Process(target=_pop_queued, args=(url, out)) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    got = [json.loads(Path(o).read_text()) for o in outs]
    assert [g["errors"] for g in got] == [[]] * WORKERS
    claimed = sorted(n for g in got for n in g["claimed"])
    assert claimed == list(range(QUEUED))  # each queued trial claimed once, none lost
