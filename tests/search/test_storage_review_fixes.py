"""Stored studies under stress: two first runs racing for one name, a database that fails or
never answers, storages nothing can share, a changed request named field by field; and what a
search leaves behind: one result per --out, SIGTERM handled like Ctrl-C, the table --out keeps.

The PostgreSQL tests start a throwaway server (tests/pg_server.py) and skip where none can start,
except under CI=true or AUTOPLAN_REQUIRE_POSTGRES=1, where they fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import sqlalchemy.exc

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.search import optuna_search
from autoplan.search import storage as storage_module
from autoplan.search.engine import run_search
from autoplan.search.optuna_search import FINGERPRINT_ATTRS, open_study
from autoplan.search.output import summary
from autoplan.search.rows import shown_rows
from autoplan.search.storage import open_storage
from tests import pg_server
from tests.search.conftest import request

ROOT = Path(__file__).resolve().parents[2]
S = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
     "--global-batch-size", "16", "--space", "small-cpu", "--sampler", "tpe"]


def _req(db: str, **kw):
    return request("small-cpu", gbs=16, sampler="tpe", trials=5, storage=db, study="r", **kw)


# --- 1. one request owns a new study ---------------------------------------------------------

def _race(monkeypatch, first, second):
    """Open `first` in a thread that stops between creating the study and marking it, open
    `second` meanwhile; the first is let go when the second waits for the mark. Returns what
    the second open_study gave (a study or the ConfigError) and the first's study."""
    attr = FINGERPRINT_ATTRS["search"]
    paused, release = threading.Event(), threading.Event()
    real_set = optuna.Study.set_user_attr

    def set_user_attr(self, key, value):
        if key == attr and threading.current_thread().name == "first":
            paused.set()
            release.wait(60)
        return real_set(self, key, value)

    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(study=open_study(first, "tpe")),
                              name="first")

    def sleep(_s: float) -> None:  # the second waits for the mark: let the first write it
        release.set()
        thread.join(60)

    monkeypatch.setattr(optuna.Study, "set_user_attr", set_user_attr)
    monkeypatch.setattr(optuna_search, "time", SimpleNamespace(monotonic=time.monotonic,
                                                               sleep=sleep))
    thread.start()
    assert paused.wait(60)
    try:
        second_got = open_study(second, "tpe")
    except ConfigError as err:
        second_got = err
    finally:
        release.set()
        thread.join(60)
    return second_got, got["study"]


def test_two_first_runs_with_different_requests_cannot_both_own_a_study(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    four, eight = _req(db), dataclasses.replace(_req(db), gpu_counts=(8,))
    second, first = _race(monkeypatch, four, eight)
    assert isinstance(second, ConfigError), "both requests passed the fingerprint check"
    assert "different search" in str(second) and "--num-gpus [4] -> [8]" in str(second)
    stored = first.user_attrs[FINGERPRINT_ATTRS["search"]]
    assert json.loads(stored)["gpu_counts"] == [4]


def test_the_same_request_racing_resumes_the_study(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    second, first = _race(monkeypatch, _req(db), _req(db))
    assert isinstance(second, optuna.Study) and second.study_name == first.study_name


def test_a_study_its_maker_never_marked_is_taken_over(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    optuna.create_study(storage=db, study_name="r", directions=["maximize"])  # maker died
    monkeypatch.setattr(optuna_search, "OWNER_WAIT_S", 0.3)
    study = open_study(_req(db), "tpe")
    assert FINGERPRINT_ATTRS["search"] in study.user_attrs


# --- 5. a changed request names what changed --------------------------------------------------

def test_a_mismatch_names_each_changed_field_with_both_values(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    open_study(_req(db), "tpe")
    with pytest.raises(ConfigError) as err:
        open_study(_req(db, seed=3), "tpe")
    assert "'r' was created by a different search (seed 0 -> 3)" in str(err.value)
    from autoplan.search.targets import Targets

    with pytest.raises(ConfigError) as err:
        open_study(_req(db, targets=Targets(max_step_time_s=3.0)), "tpe")
    assert "targets.max_step_time_s none -> 3.0" in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_profile_named_by_path_resumes_the_study_its_name_made(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    base = [*S, "--trials", "4", "--storage", db, "--study", "p", "--format", "json"]
    assert main(base) == 0
    by_path = [*base]
    by_path[by_path.index("cpu-gloo")] = str(ROOT / "profiles" / "cpu-gloo.yaml")
    assert main(by_path) == 0, capsys.readouterr().err


def test_a_study_whose_fingerprint_holds_the_profile_as_typed_still_resumes(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    req = _req(db)
    study = open_study(req, "tpe")
    old = json.loads(study.user_attrs[FINGERPRINT_ATTRS["search"]]) | {"profile": "cpu-gloo"}
    study.set_user_attr(FINGERPRINT_ATTRS["search"], json.dumps(old, sort_keys=True))
    open_study(req, "tpe")  # an older autoplan stored the ref string: it resumes


def test_a_study_from_before_memory_slack_resumes_and_p75_is_another_request(tmp_path):
    """The default --memory-slack (median) fingerprints as a study stored before the flag did,
    so such a study resumes; p75 is another request, refused naming the field."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = _req(db)
    study = open_study(req, "tpe")
    stored = json.loads(study.user_attrs[FINGERPRINT_ATTRS["search"]])
    assert "memory_slack" not in stored["targets"]
    open_study(req, "tpe")
    p75 = dataclasses.replace(req, targets=dataclasses.replace(req.targets, memory_slack="p75"))
    with pytest.raises(ConfigError, match='targets.memory_slack "median" -> "p75"'):
        open_study(p75, "tpe")


# --- 2, 3. storages and their errors ----------------------------------------------------------

@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite:///", "sqlite://"])
def test_an_sqlite_database_in_memory_is_refused_up_front(url, capsys):
    assert main([*S, "--trials", "3", "--storage", url, "--study", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "in memory" in err and "give a file path" in err
    with pytest.raises(ConfigError, match="in memory"):
        open_storage(url)


@pytest.mark.parametrize("storage", ["sqlite:///{}/s.db", "journal:{}/s.log"])
def test_a_study_name_past_the_rdb_limit_fails_alike_everywhere(storage, tmp_path, capsys):
    url = storage.format(tmp_path)
    name = "x" * (storage_module.max_study_name() + 1)
    assert main([*S, "--trials", "3", "--storage", url, "--study", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoplan search: error: --study:") and "at most 512" in err
    assert not list(tmp_path.iterdir())  # nothing opened


def test_a_storage_error_during_the_search_is_one_line_naming_storage(tmp_path, monkeypatch,
                                                                       capsys):
    real_tell, calls = optuna.Study.tell, []

    def tell(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise optuna.exceptions.StorageInternalError("commit failed") from \
                sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("server closed"))
        return real_tell(self, *a, **kw)

    monkeypatch.setattr(optuna.Study, "tell", tell)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main([*S, "--trials", "10", "--storage", db, "--study", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("autoplan search: error: --storage:") and "server closed" in err
    assert err.endswith("rerun the same command to resume")


REAL_RDB = optuna.storages.RDBStorage


def _fake_rdb(monkeypatch, message: str, fail: int):
    """RDBStorage that raises OperationalError(message) on its first `fail` calls."""
    calls = []

    def rdb(url, **kw):
        calls.append(kw)
        if len(calls) <= fail:
            raise sqlalchemy.exc.OperationalError("connect", {}, Exception(message))
        return REAL_RDB(url, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb)
    return calls


def test_only_the_sqlite_schema_race_is_retried(tmp_path, monkeypatch):
    pytest.importorskip("psycopg")
    calls = _fake_rdb(monkeypatch, 'password authentication failed for user "u"', 99)
    with pytest.raises(ConfigError, match="check the user and password in the URL"):
        open_storage("postgresql://u:secret@127.0.0.1:5432/db")
    assert len(calls) == 1  # a wrong password is not tried again
    assert calls[0]["engine_kwargs"]["connect_args"]["connect_timeout"] == 10
    calls = _fake_rdb(monkeypatch, "table studies already exists", 2)
    open_storage(f"sqlite:///{tmp_path / 'r.db'}")  # the loser of the schema race retries
    assert len(calls) == 3


@pytest.mark.parametrize("message, part", [
    ('FATAL:  password authentication failed for user "u"', "user and password"),
    ("fe_sendauth: no password supplied", "user and password"),
    ('FATAL:  role "u" does not exist', "check the user in the URL"),
    ('FATAL:  database "d" does not exist', "database name"),
    ("Connection refused", "HOST:PORT"),
    ("connection timeout expired", "HOST:PORT"),
    ('could not translate host name "nohost" to address', "HOST:PORT"),
])
def test_the_fix_names_the_part_of_the_url_to_check(message, part):
    err = sqlalchemy.exc.OperationalError("connect", {}, Exception(message))
    assert part in storage_module._storage_fix(err)


def test_a_server_that_never_answers_times_out(monkeypatch):
    pytest.importorskip("psycopg")
    monkeypatch.setattr(storage_module, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"HOST:PORT") as err:
            open_storage(f"postgresql://u:secret@127.0.0.1:{port}/db")
    assert time.monotonic() - start < 30
    assert "secret" not in str(err.value) and "***" in str(err.value)


@pytest.fixture
def postgres():
    yield from pg_server.server_or_skip()


def test_postgres_stopped_mid_search_and_names_past_the_limit(postgres, monkeypatch):
    url = postgres.create_database("mid")
    limit = storage_module.max_study_name()
    open_study(dataclasses.replace(_req(url), study="n" * limit), "tpe")  # the column holds it
    with pytest.raises(ConfigError, match="at most 512"):
        open_study(dataclasses.replace(_req(url), study="n" * (limit + 1)), "tpe")
    real, scored = optuna_search.evaluate, []

    def evaluate(layout, req):
        scored.append(layout)
        if len(scored) == 3:
            postgres.stop()  # the server goes away mid-search
        return real(layout, req)

    monkeypatch.setattr(optuna_search, "evaluate", evaluate)
    with pytest.raises(ConfigError) as err:
        run_search(dataclasses.replace(_req(url), trials=20))
    text = str(err.value)
    assert text.startswith("--storage: 'postgresql://") and "\n" not in text
    assert text.endswith("rerun the same command to resume")


def test_postgres_wrong_password_is_tried_once_and_named(postgres, capsys):
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=postgres.port, user=pg_server.DB_USER,
                         dbname="postgres", autocommit=True) as con:
        con.execute(b"CREATE ROLE pwuser LOGIN PASSWORD 'right'")
        hba = Path(con.execute(b"SHOW hba_file").fetchone()[0])
        hba.write_text("host all pwuser 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        con.execute(b"SELECT pg_reload_conf()")
    url = f"postgresql://pwuser:wrong@127.0.0.1:{postgres.port}/postgres"
    assert main([*S, "--trials", "3", "--storage", url, "--study", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "password authentication failed" in err and "wrong" not in err
    assert err.endswith("check the user and password in the URL "
                        "(postgresql://USER:PASSWORD@HOST:PORT/DB)")
    log = (postgres.root / "server.log").read_text()
    assert log.count('password authentication failed for user "pwuser"') == 1


# --- 6, 7, 8. what a search leaves behind -----------------------------------------------------

def test_force_leaves_one_result_in_out(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "o3"
    base = [*S, "--trials", "5", "--out", str(out), "--format", "json"]
    assert main([*base, "--report"]) == 0
    assert (out / "report.html").exists()
    assert main([*base, "--force", "--seed", "5"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["plan.yaml", "summary.json", "top.yaml",
                                                     "trials.csv.gz"]
    assert main([*base, "--report"]) != 0  # without --force nothing is replaced
    (out / "notes.txt").write_text("mine")  # a file not ours stays; the old report goes
    assert main([*base, "--force", "--report"]) == 0
    assert main([*base, "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "plan.yaml", "summary.json",
                                                     "top.yaml", "trials.csv.gz"]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"),
                                              (signal.SIGINT, 130, "interrupted")])
def test_a_signal_cleans_up_and_says_how_to_resume(sig, code, word, tmp_path):
    out = tmp_path / "outs" / "o2"
    argv = [*S, "--trials", "100000", "--out", str(out), "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--study", "s"]
    # Ctrl-C's handler as an interactive shell leaves it: a test run in the background (nohup,
    # `&` in a script) starts with SIGINT ignored, which Python then keeps ignored
    run = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
           " sys.argv = sys.argv[1:]; runpy.run_path('cli.py', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", run, "cli.py", *argv], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "AUTOPLAN_PROGRESS_EVERY_S": "0.2"})
    assert proc.stderr is not None
    seen = [proc.stderr.readline() for _ in range(1)]
    while seen[-1] and not seen[-1].startswith("search: trials"):  # wait until it searches
        seen.append(proc.stderr.readline())
    assert seen[-1].startswith("search: trials"), seen
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"search still ran 60 s after {sig!r}") from None
    assert proc.returncode == code
    last = err.strip().splitlines()[-1]
    assert last == (f"autoplan search: {word}; the finished trials are kept in study 's' of "
                    "--storage: rerun the same command to resume")
    assert "done in" not in err
    assert not (tmp_path / "outs").exists()  # no lock, nothing half-written, no folder made


def test_the_table_shows_the_plans_out_keeps(capsys):
    req = request("small-cpu", gbs=16, sampler="tpe", trials=30)
    result = run_search(req)
    data = summary(result, 10)
    shown = shown_rows(result, data, 10)
    assert all(s.rank <= len(data["top"]) for s in shown)
    assert main([*S, "--trials", "30", "--format", "table"]) == 0
    table = capsys.readouterr().out
    ranks = [int(m) for m in re.findall(r"^\s*(\d+)\s+\d+\s+\d+\s+\d+\s", table, re.M)]
    assert ranks and max(ranks) <= 10 and "top 10 plans" in table


def test_a_study_whose_auto_precision_settled_otherwise_says_how_to_resume(tmp_path):
    """A100+H100 studies stored when several types searched only the formats every type has
    (bf16) no longer matched `precision: auto` (bf16 and fp8), and the fix said to rerun the
    exact command the user had just rerun: it names the space precision that resumes them."""
    import json as _json

    db = f"sqlite:///{tmp_path / 'r.db'}"
    auto = request("default", gbs=16, sampler="tpe", trials=5, storage=db, study="r")
    study = open_study(auto, "tpe")
    attr = FINGERPRINT_ATTRS["search"]
    stored = _json.loads(study.user_attrs[attr])
    stored["space"]["precision"] = ["bf16"]  # as the old rule settled it
    study.set_user_attr(attr, _json.dumps(stored, sort_keys=True))
    with pytest.raises(ConfigError) as err:
        open_study(auto, "tpe")
    assert 'space.precision ["bf16"] ->' in str(err.value)
    assert "lists the study's precision ([\"bf16\"])" in str(err.value)
    fixed = request("small-cpu", gbs=16, sampler="tpe", trials=5, storage=db, study="s")
    open_study(fixed, "tpe")
    with pytest.raises(ConfigError) as err:  # a space that lists its precision: as before
        open_study(dataclasses.replace(fixed, seed=3), "tpe")
    assert "rerun that exact command" in str(err.value)
