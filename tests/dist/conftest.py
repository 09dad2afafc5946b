"""Shared fixtures of the distributed tests: one forked worker pool per session."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def pool():
    import torch

    torch.set_num_threads(1)
    from tests.dist.pool import WorkerPool

    p = WorkerPool(size=8)
    yield p
    p.close()


@pytest.fixture(scope="session")
def reference_cache():
    """Single-process reference runs, keyed by (model, batch, optimizer, steps, ...)."""
    return {}
