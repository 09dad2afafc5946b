"""A stored tune study has one owner, as a search's has: only the process whose create_study
made it marks it with its fingerprint; a process that found it waits (bounded) for that mark
and compares, so two first tunes with different requests on one name cannot both run in it.
And a --study name longer than storages hold is refused before any storage is touched."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import plan_from_dict
from autoplan.search import optuna_search
from autoplan.search.storage import max_study_name
from autoplan.tune.study import (
    FINGERPRINT_ATTR,
    TuneConfig,
    fingerprint,
    make_candidates,
    open_study,
)

REQUEST = {"model": "tiny", "cluster": "cpu-gloo", "num_gpus": 2, "global_batch_size": 16,
           "seq_len": 128}
TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2"]


def _cfg(db: Path, **request) -> TuneConfig:
    return TuneConfig(steps=4, storage=f"sqlite:///{db}", study_name="t",
                      request={**REQUEST, **request})


def _fp(cfg: TuneConfig) -> dict:
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2}, "zero_stage": 1, "precision": "fp32",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 16}})
    return fingerprint(make_candidates([(plan, "user")]), cfg)


def _race(monkeypatch, first: TuneConfig, second: TuneConfig):
    """Open `first` in a thread that stops between creating the study and marking it with its
    fingerprint, and `second` meanwhile; the first is let go once the second waits for the
    mark. Returns what the second open_study gave (a study or the ConfigError), the first's
    study, and how often the second waited."""
    paused, release = threading.Event(), threading.Event()
    real_set = optuna.Study.set_user_attr

    def set_user_attr(self, key, value):
        if key == FINGERPRINT_ATTR and threading.current_thread().name == "first":
            paused.set()
            release.wait(60)
        return real_set(self, key, value)

    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(study=open_study(first, _fp(first))),
                              name="first")
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the second waits for the mark: let the first write it
        waits.append(seconds)
        release.set()
        thread.join(60)

    monkeypatch.setattr(optuna.Study, "set_user_attr", set_user_attr)
    monkeypatch.setattr(optuna_search, "time", SimpleNamespace(monotonic=lambda: 0.0,
                                                               sleep=sleep))
    thread.start()
    assert paused.wait(60)
    try:
        second_got = open_study(second, _fp(second))
    except ConfigError as err:
        second_got = err
    finally:
        release.set()
        thread.join(60)
    return second_got, got["study"], waits


def test_two_first_tunes_with_different_requests_cannot_both_own_a_study(tmp_path, monkeypatch):
    first, second = _cfg(tmp_path / "t.db"), _cfg(tmp_path / "t.db", global_batch_size=32)
    got, study, waits = _race(monkeypatch, first, second)
    assert isinstance(got, ConfigError), "both requests passed the fingerprint check"
    assert waits, "the second tune did not wait for the maker's mark"
    assert str(got).count("\n") == 0 and "--study: 't' holds the results of another tune " \
        "(global_batch_size 16, now 32)" in str(got)
    assert study.user_attrs[FINGERPRINT_ATTR] == optuna.load_study(
        study_name="t", storage=first.storage).user_attrs[FINGERPRINT_ATTR]
    assert '"global_batch_size": 16' in study.user_attrs[FINGERPRINT_ATTR]  # the maker's kept


def test_the_same_tune_racing_resumes_the_study(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path / "t.db")
    got, study, waits = _race(monkeypatch, cfg, cfg)
    assert isinstance(got, optuna.Study) and got.study_name == study.study_name
    assert waits


def test_a_study_its_maker_never_marked_is_taken_over_after_the_bounded_wait(tmp_path,
                                                                             monkeypatch):
    cfg = _cfg(tmp_path / "t.db")
    optuna.create_study(storage=cfg.storage, study_name="t", direction="maximize")  # maker died
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(optuna_search, "OWNER_WAIT_S", 1.0)
    monkeypatch.setattr(optuna_search, "time", SimpleNamespace(monotonic=lambda: clock[0],
                                                               sleep=sleep))
    study = open_study(cfg, _fp(cfg))
    assert clock[0] >= 1.0  # it waited the whole (patched) bound for the maker's mark
    assert FINGERPRINT_ATTR in study.user_attrs and study.user_attrs["autoplan_kind"] == "tune"


def test_a_study_another_tune_marked_is_refused_without_waiting(tmp_path, monkeypatch):
    mine, other = _cfg(tmp_path / "t.db"), _cfg(tmp_path / "t.db", num_gpus=4)
    open_study(other, _fp(other))

    def sleep(seconds: float) -> None:
        raise AssertionError("waited for a study already marked")

    monkeypatch.setattr(optuna_search, "time", SimpleNamespace(monotonic=lambda: 0.0,
                                                               sleep=sleep))
    with pytest.raises(ConfigError, match=r"num_gpus 4, now 2"):
        open_study(mine, _fp(mine))


def test_a_study_name_past_the_limit_is_refused_before_any_storage(tmp_path, capsys):
    db = tmp_path / "t.db"
    name = "n" * (max_study_name() + 1)
    argv = [*TUNE, "--dry-run", "--storage", f"sqlite:///{db}", "--study", name]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and not captured.out, err
    assert "--study" in err and f"has {len(name)} characters" in err, err
    assert f"at most {max_study_name()}" in err and "give a shorter name" in err, err
    assert not db.exists()


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_open_study_refuses_a_name_past_the_limit_before_any_storage(tmp_path, storage):
    path = tmp_path / "t.store"
    url = f"sqlite:///{path}" if storage == "sqlite" else f"journal:{path}"
    cfg = TuneConfig(storage=url, study_name="n" * (max_study_name() + 1))
    with pytest.raises(ConfigError, match=r"--study: .* characters; a study name holds at most"):
        open_study(cfg)
    assert not path.exists()


def test_a_database_that_refuses_the_connection_is_one_line_without_the_password():
    """tune's --storage error shows the URL as the search does: password masked."""
    pytest.importorskip("psycopg")
    cfg = TuneConfig(storage="postgresql://tuner:s3cret-pw@127.0.0.1:9/autoplan",
                     study_name="masked")
    with pytest.raises(ConfigError) as err:
        open_study(cfg)
    text = str(err.value)
    assert "--storage" in text and "s3cret-pw" not in text and "tuner" in text
