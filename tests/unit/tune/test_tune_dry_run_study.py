"""`tune --dry-run` makes the checks the tune makes of its --study before any trial (a search's
study, another tune's) and creates nothing: no storage file, no study, no mark."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from autoplan.commands import main

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2", "--top", "1", "--steps", "3"]
FAKE_TRAIN = ("import json, sys\n"
              "with open(sys.argv[1], 'w') as fh:\n"
              "    for step in range(int(sys.argv[2])):\n"
              "        fh.write(json.dumps({'step': step, 'step_time_s': 0.01}) + '\\n')\n")


def _url(kind: str, path: Path) -> str:
    return f"sqlite:///{path}" if kind == "sqlite" else f"journal:{path}"


def _digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` and its contents' hash: what a dry run must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fake_train(monkeypatch) -> None:
    def fake(plan_path: Path, nproc: int, steps: int, metrics: Path) -> list[str]:
        return [sys.executable, "-c", FAKE_TRAIN, str(metrics), str(steps)]

    monkeypatch.setattr("autoplan.tune.runner.train_command", fake)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_dry_run_refuses_a_search_study_and_leaves_the_storage_as_it_was(
        tmp_path: Path, capsys, kind: str) -> None:
    url = _url(kind, tmp_path / "s.store")
    assert main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                 "--global-batch-size", "16", "--space", "small-cpu", "--sampler", "random",
                 "--trials", "5", "--storage", url, "--study", "s", "--format", "json"]) == 0
    capsys.readouterr()
    before = _digest(tmp_path)
    assert main([*TUNE, "--dry-run", "--storage", url, "--study", "s"]) == 2
    captured = capsys.readouterr()
    assert not captured.out
    assert "--study: 's' is an autoplan search study" in captured.err, captured.err
    assert _digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_dry_run_refuses_another_tunes_study_and_passes_its_own(
        tmp_path: Path, capsys, monkeypatch, kind: str) -> None:
    _fake_train(monkeypatch)
    monkeypatch.chdir(tmp_path)
    url = _url(kind, tmp_path / "t.store")
    assert main([*TUNE, "--storage", url, "--study", "t", "--format", "json"]) == 0
    capsys.readouterr()
    before = _digest(tmp_path)
    other = [a if a != "3" else "4" for a in TUNE]  # --steps 4: another tune's request
    assert main([*other, "--dry-run", "--storage", url, "--study", "t"]) == 2
    err = capsys.readouterr().err
    assert "--study: 't' holds the results of another tune (steps 3, now 4)" in err, err
    assert main([*TUNE, "--dry-run", "--storage", url, "--study", "t", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["trials"]) == 1
    assert _digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_dry_run_on_a_new_storage_creates_nothing(tmp_path: Path, capsys, kind: str) -> None:
    url = _url(kind, tmp_path / "new.store")
    assert main([*TUNE, "--dry-run", "--storage", url, "--study", "t", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["trials"]
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_on_an_sqlite_file_without_tables_creates_none(tmp_path: Path, capsys) -> None:
    db = tmp_path / "empty.db"
    db.write_bytes(b"")
    assert main([*TUNE, "--dry-run", "--storage", f"sqlite:///{db}", "--study", "t"]) == 0
    assert db.read_bytes() == b"" and list(tmp_path.iterdir()) == [db]


@pytest.fixture(scope="module")
def pg():
    from tests import pg_server

    yield from pg_server.server_or_skip()


def _tables(url: str) -> list[str]:
    import sqlalchemy

    from autoplan.search.storage import _with_driver

    engine = sqlalchemy.create_engine(_with_driver(url))
    try:
        return sorted(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_dry_run_on_a_database_server_reads_it_and_creates_no_tables(pg, capsys) -> None:
    url = pg.create_database("dryrun")
    assert main([*TUNE, "--dry-run", "--storage", url, "--study", "t"]) == 0
    assert _tables(url) == []  # Optuna's schema is the real tune's to create
    assert main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                 "--global-batch-size", "16", "--space", "small-cpu", "--sampler", "random",
                 "--trials", "3", "--storage", url, "--study", "s", "--format", "json"]) == 0
    capsys.readouterr()
    assert main([*TUNE, "--dry-run", "--storage", url, "--study", "s"]) == 2
    assert "'s' is an autoplan search study" in capsys.readouterr().err
