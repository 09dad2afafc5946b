"""The tune loop: pruning, failures with reasons, choosing the measured best, resuming."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autoplan.plan import plan_from_dict
from autoplan.tune.runner import run_trial
from autoplan.tune.study import TuneConfig, make_candidates, run_tune

STAND_IN = Path(__file__).with_name("stand_in_train.py")
COMMAND = (sys.executable, str(STAND_IN), "{plan}", "{metrics}", "{steps}")


def _plan(mbs: int, **extra):
    return plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2}, "zero_stage": 1, "precision": "fp32",
                           "batch": {"micro_batch_size": mbs, "global_batch_size": 16}, **extra})


def _candidates():
    return make_candidates([
        (_plan(2), "model rank 1"),
        (_plan(1), "model rank 2"),
        (_plan(8), "model rank 3"),                               # clearly slower: pruned
        (_plan(2, recompute={"policy": "full"}), "model rank 4"),  # out of memory
        (_plan(2, zero_stage=3), "model rank 5"),                 # hangs
    ])


def test_tune_prunes_records_failures_and_picks_the_measured_best(tmp_path) -> None:
    cands = _candidates()
    cfg = TuneConfig(steps=6, budget_s=120, trial_timeout_s=4, command=COMMAND)
    result = run_tune(cands, cfg, tmp_path)
    by_source = {c.source: t for c, t in zip(cands, result.trials, strict=True)}
    assert result.best is not None and result.best.source == "model rank 2"  # mbs 1 is fastest
    slow = by_source["model rank 3"]
    assert slow["status"] == "pruned" and slow["steps_run"] < 6
    oom = by_source["model rank 4"]
    assert oom["status"] == "failed" and "out of memory" in oom["reason"]
    hang = by_source["model rank 5"]
    assert hang["status"] == "failed" and "timed out" in hang["reason"]
    assert by_source["model rank 1"]["measured_step_s"] == pytest.approx(0.06)


def test_interrupted_tune_resumes_without_rerunning_finished_trials(tmp_path) -> None:
    cands = _candidates()[:3]
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    cfg = TuneConfig(steps=4, budget_s=120, trial_timeout_s=10, command=COMMAND,
                     storage=storage, study_name="t")
    calls: list[str] = []

    def interrupting_runner(plan_path, *args, **kwargs):
        calls.append(plan_path.parent.name)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user presses Ctrl-C during the second trial
        return run_trial(plan_path, *args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        run_tune(cands, cfg, tmp_path, runner=interrupting_runner)
    assert calls == [cands[0].key, cands[1].key]

    calls.clear()

    def counting_runner(plan_path, *args, **kwargs):
        calls.append(plan_path.parent.name)
        return run_trial(plan_path, *args, **kwargs)

    result = run_tune(cands, cfg, tmp_path, runner=counting_runner)
    assert cands[0].key not in calls  # finished before the interruption
    assert set(calls) == {cands[1].key, cands[2].key}
    assert result.best is not None and result.best.key == cands[1].key  # mbs 1
