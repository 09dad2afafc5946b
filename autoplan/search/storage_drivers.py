"""The database driver a --storage URL needs and the pip package that installs it, for the one
line that refuses a URL whose driver is missing (storage.py opens and checks the URLs)."""

from __future__ import annotations

import shlex
from typing import Any

from autoplan.errors import ConfigError

DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "mariadb": "mariadb",
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "pg8000": "pg8000",
    "oracledb": "oracledb",
    "pyodbc": "pyodbc",
}
"""The module a SQLAlchemy dialect imports -> the package on PyPI that provides it (SQLAlchemy
2.x dialect docs, docs.sqlalchemy.org/en/20/dialects/: mysql+mysqldb, +pymysql,
+mysqlconnector, +mariadbconnector; postgresql+psycopg2, +psycopg, +pg8000; oracle+oracledb;
mssql+pyodbc). psycopg2-binary and psycopg[binary] ship the libpq they need; psycopg2 and
psycopg without it build against a local one."""

OTHER_DRIVERS = {"MySQLdb": "or pip install PyMySQL and write mysql+pymysql:// (pure Python; "
                            "mysqlclient builds against MySQL's client library)"}
"""An easier install than the dialect's default driver, where there is one."""


def missing_module(err: BaseException) -> str | None:
    """The top-level module an import in `err` or in what caused it did not find (Optuna's
    RDBStorage raises its own ImportError from the driver's ModuleNotFoundError); None when
    no import failed."""
    seen: BaseException | None = err
    for _ in range(8):  # a cause chain is short; a cycle must not hang
        if seen is None:
            return None
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen.name.split(".")[0]
        seen = seen.__cause__ or seen.__context__
    return None


def driver_error(shown: str, err: BaseException) -> ConfigError | None:
    """The one line for a storage URL (`shown`, password masked) whose driver is not installed:
    the module and the pip command that installs it; None when `err` is not a missing module."""
    module = missing_module(err)
    if module is None:
        return None
    package = DRIVER_PACKAGES.get(module, module)
    fix = f"pip install {shlex.quote(package)}"
    if module in OTHER_DRIVERS:
        fix += f", {OTHER_DRIVERS[module]}"
    what = "the database driver" if module in DRIVER_PACKAGES else "the Python module"
    return ConfigError("--storage", f"{shown!r} needs {what} {module!r}, which is not "
                       "installed", fix)


def check_driver(dialect: Any, shown: str) -> None:
    """Import the driver of a SQLAlchemy `dialect` class, as opening the storage would, and
    refuse a missing one in one line (driver_error) before any work."""
    try:
        dialect.import_dbapi()
    except ImportError as err:
        refusal = driver_error(shown, err)
        if refusal is None:  # the driver is there but fails to import (a broken build)
            raise ConfigError("--storage", f"{shown!r}: its database driver fails to import "
                              f"({err})", "reinstall the driver") from None
        raise refusal from None
