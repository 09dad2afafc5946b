"""Stored studies: a multi-type search keeps one study per GPU type, a study resumes only under
the same profile contents, and search and tune refuse each other's studies in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.plan import plan_from_dict
from autoplan.search.engine import GpuType, run_search
from autoplan.tune.runner import TrialOutcome
from autoplan.tune.study import TuneConfig, make_candidates, run_tune
from tests.search.conftest import request

ROOT = Path(__file__).resolve().parents[2]
TYPES = ("a100-sxm4-80gb", "h100-sxm-80gb")


def _two_types(db: str, **kw):
    types = tuple(GpuType(ref, load_profile(ref), (4,)) for ref in TYPES)
    return request(cluster=TYPES[0], sampler="random", trials=4, storage=db, study="m",
                   types=types, **kw)


def test_a_multi_type_search_resumes_from_one_study_per_type(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    first = run_search(_two_types(db))
    assert sorted(optuna.get_all_study_names(db)) == [f"m/{t}" for t in TYPES]
    again = run_search(_two_types(db))  # resumes both: nothing new is sampled
    assert again.total == first.total
    assert set(first.scored.cols["cluster"]) == {0, 1}
    assert list(again.scored.cols["trial"]) == list(first.scored.cols["trial"])
    assert list(again.scored.cols["tokens_per_s"]) == list(first.scored.cols["tokens_per_s"])


def test_a_changed_profile_under_the_same_name_does_not_resume(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = request(sampler="random", trials=3, storage=db, study="p")
    run_search(req)
    prof = req.profile
    faster = dataclasses.replace(prof, device=dataclasses.replace(
        prof.device, hbm_bytes_per_s=2 * prof.device.hbm_bytes_per_s))  # recalibrated
    with pytest.raises(ConfigError, match="'p' was created by a different search"):
        run_search(dataclasses.replace(req, profile=faster))
    run_search(req)  # the unchanged profile resumes


def test_the_fingerprint_is_the_same_in_every_process() -> None:
    code = ("from tests.search.conftest import request\n"
            "from autoplan.search.optuna_search import _fingerprint\n"
            "print(_fingerprint(request(), 'tpe'))\n")
    prints = []
    for seed in ("1", "123"):  # Python's hash() differs between these; the fingerprint not
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
        assert run.returncode == 0, run.stderr[-2000:]
        prints.append(run.stdout.strip())
    assert prints[0] == prints[1]
    assert len(json.loads(prints[0])["profile_sha256"]) == 64


def _tune_candidates():
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "precision": "fp32",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 2}})
    return make_candidates([(plan, "user")])


def _quick_trial(plan_path, nproc, steps, workdir, timeout_s, on_step=None, command=None):
    return TrialOutcome(status="complete", step_times_s=[0.01] * steps)


def test_a_tune_refuses_a_search_study(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    run_search(request(sampler="random", trials=3, storage=db, study="x"))
    cfg = TuneConfig(steps=3, storage=db, study_name="x")
    with pytest.raises(ConfigError, match="'x' is an autoplan search study; an autoplan tune "
                       "cannot resume it"):
        run_tune(_tune_candidates(), cfg, tmp_path, runner=_quick_trial)


def test_a_search_refuses_a_tune_study(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    cfg = TuneConfig(steps=3, storage=db, study_name="x")
    assert run_tune(_tune_candidates(), cfg, tmp_path, runner=_quick_trial).best is not None
    for objective in ("throughput", "latency"):  # the tune's direction matches or not
        from autoplan.search.targets import Targets

        req = request(sampler="random", trials=3, storage=db, study="x",
                      targets=Targets(objectives=(objective,)))
        with pytest.raises(ConfigError, match="'x' is an autoplan tune study; an autoplan "
                           "search cannot resume it"):
            run_search(req)


def test_a_study_with_other_directions_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(storage=db, study_name="d", direction="minimize")
    with pytest.raises(ConfigError, match="'d' optimises other objectives"):
        run_tune(_tune_candidates(), TuneConfig(steps=3, storage=db, study_name="d"), tmp_path,
                 runner=_quick_trial)
