"""What every test shares: none may write into the checkout.

Tests write under their own tmp_path. A command that resolves a path against the working
directory (an export's checkpoint folder, a profile written "inside a checkout") writes into the
repository when a test runs it from there: an empty `checkpoints/` and `ck/` appeared in the
checkout after each test run until that was found by hand. After each test the folders a command
writes to by default are listed again, and a new entry fails the test that was running. Under
pytest-xdist another worker's test may have made it at the same time: the message says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WATCHED = (ROOT, ROOT / "profiles", ROOT / "search_spaces", ROOT / "benchmarks")
"""The checkout's top level and the folders whose files commands find or write by default."""
MADE_BY_TOOLS = frozenset({".pytest_cache", "__pycache__", ".hypothesis", ".benchmarks",
                           ".mypy_cache", ".ruff_cache", ".coverage"})
"""Caches that pytest, its plugins and Python write by design."""


def _entries() -> set[Path]:
    out = set()
    for folder in WATCHED:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        out |= {folder / n for n in names
                if n not in MADE_BY_TOOLS and not n.endswith(".egg-info")}
    return out


_seen: set[Path] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    _seen.update(_entries())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> object:
    result = yield  # the test's own teardown first, so that a failure here leaves none undone
    new = _entries() - _seen
    if new:
        _seen.update(new)  # each entry fails one test, not every test after it
        names = ", ".join(sorted(str(p.relative_to(ROOT)) for p in new))
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        where = (f" (under pytest-xdist worker {worker}: a test on another worker may have "
                 "made it)" if worker else "")
        pytest.fail(f"{names} appeared in the checkout during {item.nodeid}{where}: write "
                    "under tmp_path, or run the command with cwd=tmp_path", pytrace=False)
    return result
