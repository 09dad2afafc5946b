"""A --storage URL whose database driver is not installed is one line naming the pip package
that installs it (user test 38 N5: "No module named 'MySQLdb'" named no package), refused by
the URL check before any work and by the open itself."""

from __future__ import annotations

import importlib.util

import pytest

from autoplan.errors import ConfigError
from autoplan.search.storage import check_storage, open_storage, peek_storage
from autoplan.search.storage_drivers import driver_error, missing_module
from tests.cli_refusals import assert_refused

SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
          "--global-batch-size", "8", "--space", "small-cpu", "--study", "s"]


def _absent(module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")


@pytest.mark.parametrize("url,module,install", [
    ("mysql://u@localhost/db", "MySQLdb", "pip install mysqlclient"),
    ("mysql+pymysql://u@localhost/db", "pymysql", "pip install PyMySQL"),
    ("postgresql+psycopg2://u@localhost/db", "psycopg2", "pip install psycopg2-binary"),
])
def test_a_missing_driver_names_its_package(url: str, module: str, install: str) -> None:
    _absent(module)
    for step in (check_storage, open_storage, peek_storage):
        with pytest.raises(ConfigError) as err:
            step(url)
        assert f"needs the database driver {module!r}, which is not installed" in str(err.value)
        assert err.value.fix is not None and err.value.fix.startswith(install), err.value


def test_mysql_also_offers_the_pure_python_driver() -> None:
    _absent("MySQLdb")
    with pytest.raises(ConfigError) as err:
        check_storage("mysql://u:secret@localhost/db")
    assert "mysql+pymysql://" in str(err.value) and "secret" not in str(err.value)


def test_search_refuses_it_in_one_line_before_any_work(capsys) -> None:
    _absent("MySQLdb")
    assert_refused(capsys, [*SEARCH, "--storage", "mysql://u@localhost/db"],
                   "--storage", "'MySQLdb'", "pip install mysqlclient")


def test_the_package_is_found_through_the_error_that_wraps_it() -> None:
    """Optuna's RDBStorage raises its own ImportError from the driver's; psycopg's package
    (with its libpq) is quoted for the shell."""
    try:
        try:
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        except ModuleNotFoundError as inner:
            raise ImportError("Failed to import DB access module") from inner
    except ImportError as outer:
        wrapped = outer
    assert missing_module(wrapped) == "psycopg"
    refusal = driver_error("postgresql+psycopg://h/db", wrapped)
    assert refusal is not None and refusal.fix == "pip install 'psycopg[binary]'"
    assert driver_error("x", ValueError("no import")) is None

