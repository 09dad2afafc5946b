"""Test-only planted parallelism bugs, applied by monkeypatching inside a worker process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    raise KeyError(name)
    yield
