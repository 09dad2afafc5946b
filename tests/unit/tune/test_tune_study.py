"""The tune study: trials ranked and pruned by measured tokens/s (not raw step time), and a
stored study resumed only by the tune that made it (same request, steps and candidates)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.model_spec import load_model
from autoplan.plan import plan_from_dict
from autoplan.tune.runner import TrialOutcome
from autoplan.tune.study import TuneConfig, make_candidates, run_tune

REQUEST = {"model": "tiny", "cluster": "cpu-gloo", "num_gpus": 2, "global_batch_size": 16,
           "seq_len": 128}


def _plan(mbs: int, gbs: int = 16):
    return plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2}, "zero_stage": 1, "precision": "fp32",
                           "batch": {"micro_batch_size": mbs, "global_batch_size": gbs}})


def fake_runner(calls: list[str] | None = None):
    """A trial without a process: 0.03 s per step per sequence of micro-batch, every step
    reported to the pruner as the real runner does."""

    def run(plan_path: Path, nproc, steps, workdir, timeout_s, on_step=None, command=None):
        if calls is not None:
            calls.append(plan_path.parent.name)
        mbs = yaml.safe_load(plan_path.read_text())["batch"]["micro_batch_size"]
        out = TrialOutcome(status="complete")
        for step in range(1, steps + 1):
            out.step_times_s.append(0.03 * mbs)
            if on_step and on_step(step, 0.03 * mbs):
                out.status, out.reason = "pruned", f"pruned after step {step}"
                break
        return out

    return run


def test_the_winner_trains_the_most_tokens_per_second_not_the_shortest_step(tmp_path) -> None:
    # a batch of 2 steps in 0.03 s (67 sequences/s); the batch of 16 in 0.06 s (267/s)
    cands = make_candidates([(_plan(2), "model rank 1"), (_plan(1, gbs=2), "user")])
    result = run_tune(cands, TuneConfig(steps=6, budget_s=60), tmp_path, runner=fake_runner())
    assert result.best is not None and result.best.key == cands[0].key
    short_step = result.trials[1]
    assert short_step["status"] == "pruned", short_step  # a quarter of the best's tokens/s
    first = result.trials[0]
    assert first["measured_step_s"] == pytest.approx(0.06)
    seq_len = load_model("tiny").seq_len
    assert first["measured_tokens_per_s"] == pytest.approx(16 * seq_len / 0.06)


def test_a_stored_tune_resumes_only_for_the_same_steps_and_candidates(tmp_path) -> None:
    cands = make_candidates([(_plan(1), "model rank 1"), (_plan(2), "model rank 2")])
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    cfg = TuneConfig(steps=4, budget_s=60, storage=storage, study_name="t")
    calls: list[str] = []
    first = run_tune(cands, cfg, tmp_path, runner=fake_runner(calls))
    assert len(calls) == 2 and first.best is not None

    with pytest.raises(ConfigError, match=r"--study: 't' holds the results of another tune "
                       r"\(steps 4, now 8\)"):  # not the stored 4-step results as 8-step ones
        run_tune(cands, dataclasses.replace(cfg, steps=8), tmp_path, runner=fake_runner(calls))
    with pytest.raises(ConfigError, match="other candidate plans"):  # not Optuna's ValueError
        run_tune(cands[:1], cfg, tmp_path, runner=fake_runner(calls))
    assert len(calls) == 2  # nothing ran for a refused study

    again = run_tune(cands, cfg, tmp_path, runner=fake_runner(calls))
    assert len(calls) == 2  # the same tune resumes: every trial already decided
    assert again.best_key == first.best_key
    assert [t["measured_step_s"] for t in again.trials] == \
        [t["measured_step_s"] for t in first.trials]


def test_a_stored_tune_resumes_only_for_the_same_request(tmp_path) -> None:
    cands = make_candidates([(_plan(1), "model rank 1")])
    cfg = TuneConfig(steps=4, budget_s=60, storage=f"sqlite:///{tmp_path / 'tune.db'}",
                     study_name="t", request=REQUEST)
    run_tune(cands, cfg, tmp_path, runner=fake_runner())
    other = dataclasses.replace(cfg, request={**REQUEST, "global_batch_size": 32})
    with pytest.raises(ConfigError, match="global_batch_size 16, now 32"):
        run_tune(cands, other, tmp_path, runner=fake_runner())
