"""One Optuna study shared over a real PostgreSQL server: two `autoplan search` workers and a
third killed with SIGKILL mid-trial end with the ranking of a single-process run.

The server is started by the fixture (tests/pg_server.py) on 127.0.0.1 as an unprivileged
user. Where none can be started the test is skipped, except under CI=true or
AUTOPLAN_REQUIRE_POSTGRES=1 (set by .ci/run), where it fails.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autoplan.search.engine import run_search
from tests import pg_server
from tests.search.conftest import request

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 14
SEED = 5
SPACE: dict[str, Any] = {  # 8 layouts at 4 GPUs, so every run of TRIALS trials sees them all
    "schema_version": 1, "name": "pg-small",
    "parallel": {"dp": None, "tp": [1, 2], "pp": [1, 2], "cp": [1]},
    "sequence_parallel": [False, True],
    "pipeline": {"schedule": ["1f1b"], "vpp": [1]},
    "zero_stage": [0, 1], "recompute": {"policy": ["none", "full"], "num_layers": [None]},
    "micro_batch_size": [1, 2], "precision": "fp32", "attention": ["flash"],
}
LAYOUTS = 8
PLAN_KEYS = ("num_gpus", "dp", "tp", "pp", "sp", "schedule", "vpp", "split", "zero_stage",
             "recompute", "recompute_layers", "mbs", "attention")


@pytest.fixture(scope="module")
def postgres():
    yield from pg_server.server_or_skip()


def _ranking(result) -> tuple[list[tuple], set[tuple]]:
    """(score sequence in rank order, the set of ranked plans with their scores): plans of equal
    score may swap places between runs (ties fall back to sampling order)."""
    c = result.scored.cols
    rows = [(tuple(int(c[k][i]) for k in PLAN_KEYS), float(c["tokens_per_s"][i]),
             float(c["mem_total"][i])) for i in result.order]
    return [r[1:] for r in rows], set(rows)


def _trials(storage: Any, study: str) -> list[Any]:
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


def _kill_mid_trial(cmd: list[str], storage: Any, env: dict[str, str]) -> int:
    """Start a worker, SIGKILL it while it holds a RUNNING trial; return that trial's number."""
    for _ in range(5):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            trials = _trials(storage, "s")
            done = sum(t.state == TrialState.COMPLETE for t in trials)
            if done >= 3 and any(t.state == TrialState.RUNNING for t in trials):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        proc.wait()
        running = [t.number for t in _trials(storage, "s") if t.state == TrialState.RUNNING]
        if proc.returncode == -signal.SIGKILL and running:
            return running[0]
    pytest.fail("could not kill the worker while it held a trial")


def test_workers_and_a_killed_worker_share_a_postgres_study(postgres, space_file) -> None:
    url = postgres.create_database("shared_study")
    space = space_file(SPACE)
    cmd = [sys.executable, "-m", "autoplan.commands", "search", "--model", "tiny", "--cluster",
           "cpu-gloo", "--num-gpus", "4", "--global-batch-size", "8", "--space", str(space),
           "--sampler", "tpe", "--trials", str(TRIALS), "--seed", str(SEED),
           "--storage", url, "--study", "s", "--format", "json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    storage = optuna.storages.RDBStorage(url)
    orphan = _kill_mid_trial(cmd + ["--worker", "2"], storage, env)

    workers = [subprocess.Popen(cmd + ["--worker", str(w)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env) for w in (0, 1)]
    outs = [p.communicate(timeout=300) for p in workers]
    assert [p.returncode for p in workers] == [0, 0], [e[-600:] for _, e in outs]

    trials = _trials(storage, "s")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert TRIALS <= len(complete) <= TRIALS + 1  # each worker stops once the study holds TRIALS
    assert next(t for t in trials if t.number == orphan).state == TrialState.RUNNING
    layouts = {str(t.user_attrs["record"]["layout"]) for t in complete}
    assert len(layouts) == LAYOUTS  # the premise of the comparison: the space was covered

    req = request(SPACE, gpus=(4,), gbs=8, sampler="tpe", trials=TRIALS, seed=SEED)
    shared = run_search(dataclasses.replace(req, storage=url, study="s"))  # no new trials
    assert len(_trials(storage, "s")) == len(trials)
    single = run_search(req)
    assert single.scored.n == shared.scored.n
    assert _ranking(shared) == _ranking(single)
