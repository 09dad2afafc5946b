"""Workers sharing one study each say what they added and what the study holds at the end
(user test 36, finding 9: two workers both said "stored 40, new 81", and two fresh SQLite
workers' summaries lacked `studies`); `postgres://` URLs are read as postgresql:// (finding
11). The PostgreSQL test starts a throwaway server (tests/pg_server.py) and skips where none
can start, except under CI=true or AUTOPLAN_REQUIRE_POSTGRES=1."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autoplan.search.engine import run_search
from autoplan.search.optuna_search import run_optuna
from autoplan.search.storage import database_url, open_storage
from autoplan.search.summary import resumed_lines, study_counts
from tests import pg_server
from tests.search.conftest import request

ROOT = Path(__file__).resolve().parents[2]


def _complete(url: str, name: str) -> int:
    study = optuna.load_study(study_name=name, storage=url)
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def test_a_worker_counts_its_own_trials_apart_from_another_workers(tmp_path) -> None:
    """Worker 1 runs to 4 trials while worker 0 holds the study after its first trial."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = request("small-cpu", gbs=16, sampler="random", trials=7, storage=db, study="w")
    other = dataclasses.replace(req, worker=1, trials=4)
    ran = []

    def meanwhile(study, trial) -> None:
        if not ran:
            ran.append(run_optuna(other, "random")[2])

    _, _, mine = run_optuna(req, "random", callbacks=[meanwhile])
    assert ran[0] is not None and (ran[0].stored, ran[0].new, ran[0].held) == (1, 3, 4)
    assert mine is not None and (mine.stored, mine.new, mine.held) == (0, 4, 7)
    assert mine.new + ran[0].new == mine.held == _complete(db, "w")


def test_the_line_names_this_workers_trials_the_others_and_the_overshoot() -> None:
    studies = [{"study": "s1", "stored": 40, "new": 41, "held": 121, "trials": 120},
               {"study": "a", "stored": 0, "new": 30, "held": 60, "trials": 60},
               {"study": "b", "stored": 0, "new": 5, "held": 5, "trials": 5}]
    assert resumed_lines(studies) == [
        "resumed study s1: 40 trials stored, 41 new by this worker, 40 by others sharing it: "
        "it holds 121 (--trials 120 is the study's total; workers sharing a study each finish "
        "the trial they have in flight, so it holds 1 more)",
        "study a: 30 new by this worker, 30 by others sharing it: it holds 60 (--trials 60 is "
        "the study's total)"]


def test_summary_studies_come_from_the_search_itself(tmp_path) -> None:
    """Counted on the study the search opened, not by a second read-only look at the file
    (which fails while another worker writes an SQLite file: no `studies` at all)."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = request("small-cpu", gbs=16, sampler="random", trials=3, storage=db, study="c")
    assert study_counts(run_search(req)) == [
        {"study": "c", "stored": 0, "new": 3, "held": 3, "trials": 3}]
    assert study_counts(run_search(dataclasses.replace(req, trials=5))) == [
        {"study": "c", "stored": 3, "new": 2, "held": 5, "trials": 5}]
    assert study_counts(run_search(dataclasses.replace(req, storage=None, study=None))) == []


def _workers(url: str, trials: int, tmp_path: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "autoplan.commands", "search", "--model", "tiny", "--cluster",
           "cpu-gloo", "--num-gpus", "4", "--global-batch-size", "8", "--space", "small-cpu",
           "--sampler", "random", "--trials", str(trials), "--storage", url, "--study", "s",
           "--format", "json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen(cmd + ["--worker", str(w)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, cwd=tmp_path) for w in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-600:] for _, e in outs]
    return [{"summary": json.loads(o), "stderr": e.decode()} for o, e in outs]


def test_two_fresh_sqlite_workers_each_report_their_own_trials(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    runs = _workers(db, 24, tmp_path)
    studies = [r["summary"]["studies"] for r in runs]  # both have it
    held = _complete(db, "s")
    assert 24 <= held <= 25  # each worker may finish the trial it has in flight
    assert studies[0][0]["new"] + studies[1][0]["new"] == held
    # `stored`: what the study held when that worker opened it (the later one may find some)
    assert all(s[0]["stored"] + s[0]["new"] <= s[0]["held"] <= held for s in studies)


def test_postgres_scheme_is_read_as_postgresql(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert database_url("postgres://ap:secret@db:5432/studies") == \
            "postgresql://ap:secret@db:5432/studies"
        database_url("postgres://ap:secret@db:5432/studies")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["--storage: reading postgres://ap:***@db:5432/studies as "
                     "postgresql://ap:***@db:5432/studies (SQLAlchemy's name for PostgreSQL)"]
    assert database_url("postgresql://x@h/d") == "postgresql://x@h/d"
    assert database_url("sqlite:///postgres://x.db") == "sqlite:///postgres://x.db"


def test_a_postgres_url_passes_the_up_front_check(capsys) -> None:
    from autoplan.search.storage import check_storage

    check_storage("postgres://ap@127.0.0.1:1/studies")  # refused before: NoSuchModuleError


@pytest.fixture(scope="module")
def postgres():
    yield from pg_server.server_or_skip()


def test_workers_on_a_postgres_scheme_url_share_one_study(postgres, tmp_path) -> None:
    url = postgres.create_database("alias_study").replace("postgresql://", "postgres://", 1)
    assert open_storage(url) is not None
    runs = _workers(url, 16, tmp_path)
    held = _complete(database_url(url), "s")
    assert 16 <= held <= 17
    assert sum(r["summary"]["studies"][0]["new"] for r in runs) == held
    for r in runs:
        notes = [ln for ln in r["stderr"].splitlines() if "as postgresql://" in ln]
        assert len(notes) == 1, r["stderr"][-600:]
