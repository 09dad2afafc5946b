"""Where studies live: opening an Optuna storage from a --storage URL (SQLite, PostgreSQL or
another RDB, an Optuna journal file), checking the URL, the study name and a journal before
anything is written (storage_drivers.py: a URL's driver), and turning a storage that fails
while a search runs into one line.
search (optuna_search.py) and tune (tune/study.py) share it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from autoplan import fsutil
from autoplan.errors import ConfigError
from autoplan.search.storage_drivers import check_driver, driver_error

log = logging.getLogger(__name__)
STORAGE_ATTEMPTS = 5
"""Tries to open a fresh SQLite file that other workers are creating the schema in at once."""
SQLITE_BUSY_TIMEOUT_S = 60.0
"""How long a worker waits for another's SQLite write lock before the storage raises."""
CONNECT_TIMEOUT_S = 10
"""How long a database server may take to accept a connection (libpq's connect_timeout): a
host that drops packets or a server that never answers fails in seconds, not minutes."""

def open_storage(url: str | None) -> Any:
    """None: in memory; sqlite:///x.db or another RDB URL; journal:PATH for a journal file."""
    if url is None:
        return optuna.storages.InMemoryStorage()
    if url.startswith("journal:"):
        path = url.removeprefix("journal:").removeprefix("//")
        check_journal(path)
        return _journal(path)
    check_not_in_memory(url)
    given, url = url, _with_driver(url)
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            if not url.startswith("sqlite"):
                return optuna.storages.RDBStorage(url, engine_kwargs=_server_kwargs(url))
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}})
            _serialize_sqlite(storage.engine)
            return storage
        except Exception as err:  # sqlalchemy raises many kinds
            if attempt + 1 < STORAGE_ATTEMPTS and _schema_race(url, err):
                # workers creating a fresh SQLite schema at once race; the loser retries
                time.sleep(0.2 * (attempt + 1))
                continue
            raise _open_error(given, err) from None
    raise AssertionError("unreachable")


def peek_storage(url: str) -> Any | None:
    """The storage at `url` opened only to read, or None where it holds no study yet (a file
    not there or empty, a database without Optuna's tables): nothing is created, migrated or
    written, for what a run would check once it opened the storage (a tune's --dry-run)."""
    if url.startswith("journal:"):
        path = url.removeprefix("journal:").removeprefix("//")
        check_journal(path)
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return None  # the run would create it
        return _journal(path)  # an existing journal is only read until a study is written to
    check_not_in_memory(url)
    return _peek_rdb(url)


def _journal(path: str) -> Any:
    """The journal storage at `path`, refused in one line when Optuna cannot replay it."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    try:
        return JournalStorage(JournalFileBackend(path))
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        # a damaged line further on (JSONDecodeError is one), or entries of JSON objects that
        # are no operation Optuna knows or lack its fields (its replay asserts or looks up)
        raise _damaged(path, err) from None


def _peek_rdb(url: str) -> Any | None:
    """An RDB storage read without creating its tables (SQLite opened read-only), or None
    where there are none to read."""
    import sqlite3
    from urllib.parse import quote

    import sqlalchemy
    from sqlalchemy.engine import make_url

    given, url = url, _with_driver(url)
    kwargs: dict[str, Any] = _server_kwargs(url)
    try:
        if url.startswith("sqlite"):
            path = make_url(url).database or ""
            if not os.path.isfile(path) or os.path.getsize(path) == 0:
                return None  # the run would create it
            uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
            kwargs = {"creator": lambda: sqlite3.connect(uri, uri=True)}
        engine = sqlalchemy.create_engine(url, **kwargs)
        try:
            if not sqlalchemy.inspect(engine).has_table("studies"):
                return None
        finally:
            engine.dispose()
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, skip_table_creation=True)
    except ConfigError:
        raise
    except Exception as err:  # sqlalchemy raises many kinds; Optuna a RuntimeError for old tables
        raise _open_error(given, err) from None


def _open_error(url: str, err: BaseException) -> ConfigError:
    """A storage that failed to open, in one line: its missing driver and the package to
    install, or the driver's reason and the fix that fits it."""
    shown = shown_url(url)
    return driver_error(shown, err) or ConfigError(
        "--storage", f"cannot open {shown!r} ({_reason(err)})", _storage_fix(err))


def _server_kwargs(url: str) -> dict[str, Any]:
    """A connect timeout for PostgreSQL (unless the URL sets its own): without one a server
    that accepts and never answers hangs the search for minutes."""
    from sqlalchemy.engine import make_url

    if not url.startswith("postgresql") or "connect_timeout" in make_url(url).query:
        return {}
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}


def _schema_race(url: str, err: Exception) -> bool:
    """Workers creating one fresh SQLite schema at once: the loser meets a table or row the
    winner just made, or its lock. Nothing else is retried (a wrong password is not)."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    cause = err.__cause__ if isinstance(err, optuna.exceptions.StorageInternalError) else err
    return url.startswith("sqlite") and isinstance(cause, (OperationalError, IntegrityError))


CONNECTION_WORDS = ("connection refused", "timeout expired", "timed out", "could not translate",
                    "name or service not known", "no route to host", "network is unreachable")
"""The drivers' words (psycopg, psycopg2) for a server that cannot be reached."""


def _storage_fix(err: BaseException) -> str:
    """The fix that fits a failed connection: the password, the user, the database name, or
    the host and port; the general one when the driver's words are not known."""
    text = str(getattr(err, "orig", None) or err.__cause__ or err).lower()
    if "password" in text or "authentication failed" in text:
        return "check the user and password in the URL (postgresql://USER:PASSWORD@HOST:PORT/DB)"
    if "does not exist" in text and "role " in text:
        return "check the user in the URL (postgresql://USER@HOST:PORT/DB)"
    if "does not exist" in text and "database " in text:
        return "check the database name at the end of the URL (/DB), or create that database"
    if any(w in text for w in CONNECTION_WORDS):
        return "check HOST:PORT in the URL, and that the server runs and can be reached"
    return "use sqlite:///PATH.db, an RDB URL, or journal:PATH"


def check_not_in_memory(url: str) -> None:
    """Refuse an SQLite database in memory (sqlite://, sqlite:///, sqlite:///:memory:): no
    other worker can share it, nothing resumes from it, and Optuna meets it without tables."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # not a URL: refused later with the reason
        return
    if parsed.get_backend_name() != "sqlite":
        return
    db = parsed.database or ""
    if db in ("", ":memory:") or db.startswith("file::memory:") \
            or parsed.query.get("mode") == "memory":
        raise ConfigError("--storage", f"{url!r} is an SQLite database in memory, which no "
                          "other worker can share and nothing can resume",
                          "give a file path, e.g. sqlite:///study.db")


def max_study_name() -> int:
    """Characters a study name may have: the RDB storages' study_name column (512 in Optuna 3
    to 5); applied to every storage, so a name fails the same way everywhere."""
    try:
        from optuna.storages._rdb.models import StudyModel

        return int(StudyModel.__table__.c.study_name.type.length)
    except Exception:  # a private module that moved: Optuna's long-standing limit
        return 512


def check_study_name(name: str | None, reserve: int = 0, why: str = "") -> None:
    """Refuse, before anything is opened, a --study name longer than storages hold
    (`reserve` characters are added to it later, e.g. "/TYPE" per GPU type)."""
    limit = max_study_name() - reserve
    if name is not None and len(name) > limit:
        raise ConfigError("--study", f"{name[:40]!r}... has {len(name)} characters; a study "
                          f"name holds at most {limit}{why}", "give a shorter name")


def shown_url(url: str) -> str:
    """The storage URL as the user gave it, with any password masked (it ends up in logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy can parse: nothing in it to recognise as a password
        return url


def _reason(err: BaseException) -> str:
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


def database_url(url: str) -> str:
    """`postgres://...` (Heroku's, Render's and many platforms' spelling) as postgresql://,
    the name SQLAlchemy knows since 1.4 dropped the alias; other URLs as given."""
    if not url.startswith("postgres://"):
        return url
    _said_postgres(shown_url(url))
    return "postgresql://" + url.removeprefix("postgres://")


@functools.cache
def _said_postgres(shown: str) -> None:
    """One line per URL and process, however often it is opened."""
    log.warning("--storage: reading %s as postgresql://%s (SQLAlchemy's name for PostgreSQL)",
                shown, shown.removeprefix("postgres://"))


def _with_driver(url: str) -> str:
    """postgresql://... (or postgres://) with the driver that is installed: SQLAlchemy's
    default for the plain scheme is psycopg 3 from 2.1 on and psycopg2 before; either works
    for Optuna."""
    import importlib.util

    url = database_url(url)
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


@contextmanager
def journal_errors(url: str | None) -> Iterator[None]:
    """A journal line damaged while a study is open (another writer) as one ConfigError."""
    try:
        yield
    except ValueError as err:
        journal = bool(url) and str(url).startswith("journal:")
        if not journal or not (isinstance(err, json.JSONDecodeError)
                               or str(err) == "Invalid log format."):
            raise
        raise _damaged(str(url).removeprefix("journal:").removeprefix("//"), err) from None


@contextmanager
def storage_errors(url: str | None) -> Iterator[None]:
    """A database that fails once the search runs (the server stopped, the connection lost, a
    value past a column's length) as one line: the finished trials stay in the study."""
    try:
        yield
    except Exception as err:
        internal = isinstance(err, optuna.exceptions.StorageInternalError)
        cause = err.__cause__ if internal and err.__cause__ is not None else err
        if url is None or not (internal or type(err).__module__.startswith("sqlalchemy")):
            raise
        raise ConfigError("--storage", f"{shown_url(url)!r} failed during the search "
                          f"({_reason(cause)})", "once it answers again, rerun the same "
                          "command to resume") from None


def check_storage(url: str) -> None:
    """Refuse, before any work, an Optuna storage file that cannot be made: journal:PATH or
    sqlite:///PATH naming a directory, lying under a file, in a missing or unwritable folder;
    and an SQLite database in memory, which nothing can share or resume."""
    fix = "write journal:PATH or sqlite:///PATH.db"
    check_not_in_memory(url)
    if url.startswith("journal:"):
        path = url.removeprefix("journal:").removeprefix("//")
    elif url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
    else:  # a database server: Optuna reports what is wrong with it when it connects
        _check_database_url(url, fix)
        return
    if not path:
        raise ConfigError("--storage", f"{url!r} needs a path", f"{fix}, e.g. journal:study.log")
    p = Path(path)
    if p.is_dir():
        raise ConfigError("--storage", f"{path!r} is a directory", f"{fix} naming a file")
    fsutil.check_parent(p, "--storage")
    if not p.parent.is_dir():
        raise ConfigError("--storage", f"the directory {str(p.parent)!r} does not exist",
                          "create it first or give another path")
    if url.startswith("journal:"):
        check_journal(path)


def _check_database_url(url: str, fix: str) -> None:
    """A URL SQLAlchemy parses, of a database kind it knows, whose driver is installed;
    checked without connecting, so a tune's --dry-run, which opens nothing, refuses what the
    tune itself would."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(_with_driver(url)).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise ConfigError("--storage", f"got {shown_url(url)[:120]!r}, which is no storage URL "
                          f"({err.__class__.__name__})", f"{fix}, or a database URL such as "
                          "postgresql://USER@HOST/DB") from None
    check_driver(dialect, shown_url(url))
