"""What a checkpoint folder lets `autoplan train` do, decided before launch (exit 2, one line,
nothing written): a fresh run into another run's checkpoints, --resume of nothing over a run's
metrics file, of another optimizer, batch, data or seed, or of a checkpoint past --steps; one
at --steps is a run done (exit 0, one line, nothing written); and the optimizer a checkpoint
holds is told from its keys when meta.json does not say."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from autoplan.plan_files import save_plan
from autoplan.runtime.checkpoint_compat import RunSettings, checkpoint_meta, saved_optimizer
from autoplan.runtime.checkpoint_files import verify
from autoplan.runtime.metrics import StepMetrics
from autoplan.runtime.models.transformer import build_meta_model
from tests.cli_refusals import assert_refused
from tests.dist.parity import TEST_MODELS, make_plan

SPEC = TEST_MODELS["h8-2l"]
ADAMW = RunSettings(optimizer="adamw", lr=1e-3, weight_decay=0.0, global_batch_size=8,
                    data=None, seed=0)


def _save(path: Path, step: int = 5, run: RunSettings | None = ADAMW,
          optimizer: str = "adamw") -> None:
    """A single-process DCP checkpoint named as the runtime names it, with `optimizer`'s
    state keys (flattened as Checkpointer saves them)."""
    model = build_meta_model(SPEC).to_empty(device="cpu")
    params = {k: v for k, v in model.state_dict().items()}
    fqn = next(iter(params))
    optim: dict = {f"param_groups.{fqn}.lr": 1e-3}
    if optimizer == "adamw":
        optim |= {f"state.{fqn}.exp_avg": torch.zeros(2), f"state.{fqn}.exp_avg_sq":
                  torch.zeros(2), f"param_groups.{fqn}.betas": (0.9, 0.95)}
    else:
        optim |= {f"param_groups.{fqn}.momentum": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": params, "optim": optim}, checkpoint_id=str(path))
    plan = make_plan("h8-2l")
    meta = {"step": step, **checkpoint_meta(plan, SPEC, plan.world_size, run)}
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch fails the test: every refusal here comes before torchrun."""
    def launched(*args, **kwargs):
        raise AssertionError("torchrun was launched")

    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", launched)


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


@pytest.fixture
def setup(tmp_path):
    ck = tmp_path / "ck"
    _save(ck / "step-00000005")
    plan = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    return tmp_path, ck, plan


def test_a_fresh_run_into_a_folder_of_checkpoints_is_refused(setup, capsys, no_launch):
    """It replaced same-step checkpoints, pruned the old run's, and a later --resume picked
    whichever step was newest."""
    tmp_path, ck, plan = setup
    before = _tree(tmp_path)
    assert_refused(capsys, ["train", plan, "--steps", "3", "--checkpoint-dir", str(ck),
                            "--checkpoint-every", "1"],
                   f"--checkpoint-dir: {ck} holds checkpoints (step-00000005)",
                   "pass --resume to continue that run or choose an empty directory")
    assert _tree(tmp_path) == before


def test_a_folder_without_checkpoints_is_still_a_fresh_runs(tmp_path):
    from autoplan.runtime.train_args import _check_no_checkpoints

    (tmp_path / "notes").mkdir()
    (tmp_path / "step-00000003.tmp").mkdir()  # a killed save: never a checkpoint
    _check_no_checkpoints(str(tmp_path))


@pytest.mark.parametrize("where", ["typo", "empty"])
def test_resume_without_a_checkpoint_over_a_runs_metrics_is_refused(setup, capsys, no_launch,
                                                                    where):
    """It started at step 0 and truncated the metrics file of the run it meant to continue."""
    tmp_path, _, plan = setup
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(json.dumps(asdict(StepMetrics(s, 1.0, 0.1, 10.0, 1, 0.5)))
                               + "\n" for s in (1, 2)))  # what MetricsSink writes
    target = tmp_path / "ck_typo"
    if where == "empty":
        target.mkdir()
    before = _tree(tmp_path)
    assert_refused(capsys, ["train", plan, "--steps", "3", "--checkpoint-dir", str(target),
                            "--resume", "--metrics-file", str(metrics)],
                   f"--resume: --checkpoint-dir {target} holds no checkpoint",
                   f"--metrics-file {metrics} holds a run's steps")
    assert _tree(tmp_path) == before


def test_a_jobs_first_launch_resumes_nothing_and_starts(tmp_path):
    """Exported jobs always pass --resume (export/launch.py train_argv): their first launch, in
    an empty folder and without a metrics file, starts at step 0."""
    import argparse

    from autoplan.export.base import ExportOptions
    from autoplan.export.launch import train_argv
    from autoplan.runtime.resume import resume_preflight

    assert "--resume" in train_argv(ExportOptions(gpus_per_node=8))
    (tmp_path / "ck").mkdir()
    args = argparse.Namespace(checkpoint_dir=str(tmp_path / "ck"), resume=True, elastic=False,
                              metrics_file=None, steps=3)
    resume_preflight(args, make_plan("h8-2l"), SPEC)  # no refusal
    (tmp_path / "m.jsonl").write_text("")
    resume_preflight(argparse.Namespace(**{**vars(args), "metrics_file": str(
        tmp_path / "m.jsonl")}), make_plan("h8-2l"), SPEC)  # an empty file holds no run


REFUSED = [  # (flags, needles): each named the saved and the given value
    (["--optimizer", "sgd"], ["--optimizer: sgd, but step-00000005 was saved with adamw",
                              "pass --optimizer adamw"]),
    (["--steps", "4"], ["--steps: checkpoint step 5 >= --steps 4: nothing to train",
                        "raise --steps above 5"]),
    (["--seed", "7"], ["--seed: 7, but step-00000005 was saved with --seed 0"]),
    (["--data", "{data}"], ["--data: '{data}', but step-00000005 was saved training on "
                            "synthetic tokens"]),
]


@pytest.mark.parametrize(("flags", "needles"), REFUSED, ids=[" ".join(f) for f, _ in REFUSED])
def test_resume_with_other_settings_is_refused_before_launch(setup, capsys, no_launch, flags,
                                                             needles):
    tmp_path, ck, plan = setup
    data = tmp_path / "text.txt"
    data.write_text("autoplan " * 200)
    fill = {"data": str(data.resolve())}
    before = _tree(tmp_path)
    argv = ["train", plan, "--steps", "8", "--checkpoint-dir", str(ck), "--resume"]
    assert_refused(capsys, argv + [f.format(**fill) for f in flags],
                   *(n.format(**fill) for n in needles))
    assert _tree(tmp_path) == before


DONE = "trained all 5 steps already (checkpoint step 5 in {ck}): nothing to do"
"""What a --resume over the fixture's step-00000005 at --steps 5 says."""


def test_resume_of_a_checkpoint_at_steps_is_a_run_done(setup, capsys, no_launch):
    """A job started again after it ended (resubmitted, requeued, chained afterok) used to
    fail (exit 2, and under torchrun a restart spent): now it exits 0 with one line, launching
    nothing and writing nothing (no metrics file, no run record)."""
    from autoplan.commands import main

    tmp_path, ck, plan = setup
    before = _tree(tmp_path)
    code = main(["train", plan, "--steps", "5", "--checkpoint-dir", str(ck), "--resume",
                 "--metrics-file", str(tmp_path / "m.jsonl"),
                 "--run-record", str(tmp_path / "run.json")])
    captured = capsys.readouterr()
    assert (code, captured.out) == (0, ""), captured.err
    assert captured.err == f"autoplan train: {DONE.format(ck=ck)}\n"
    assert _tree(tmp_path) == before


@pytest.fixture
def in_place(monkeypatch, tmp_path):
    """The environment of rank 0 of 1 started by a scheduler (`autoplan train` then runs in
    place), with the job script's saved-step file named; the rank's signal handlers undone."""
    import signal

    from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "0", SAVED_STEP_ENV: str(tmp_path / "saved-step")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def test_a_jobs_ranks_end_a_run_done_before_they_build_anything(setup, capsys, monkeypatch,
                                                                 in_place):
    """An exported job's `autoplan train --resume` (in place under torchrun): every rank sees
    the checkpoint at --steps before its process group, rank 0 says it, and each exits 0
    writing nothing, no saved-step file either (the script then ends on torchrun's 0)."""
    from autoplan.commands import main

    def built(*args, **kwargs):
        raise AssertionError("the rank built its process group")

    monkeypatch.setattr("autoplan.runtime.worker._init_process_group", built)
    tmp_path, ck, plan = setup
    before = _tree(tmp_path)
    code = main(["train", plan, "--steps", "5", "--checkpoint-dir", str(ck), "--resume"])
    captured = capsys.readouterr()
    assert (code, captured.out) == (0, ""), captured.err
    assert captured.err == f"autoplan train: {DONE.format(ck=ck)}\n"
    assert _tree(tmp_path) == before
    assert_refused(capsys, ["train", plan, "--steps", "4", "--checkpoint-dir", str(ck),
                            "--resume"], "--steps: checkpoint step 5 >= --steps 4")


def test_resume_with_another_global_batch_is_refused(setup, capsys, no_launch):
    """Step t reads samples [(t-1)B, tB): a resume at B=16 skipped the samples 40..79."""
    tmp_path, ck, _ = setup
    plan = str(save_plan(make_plan("h8-2l", gbs=16), tmp_path / "gbs16.yaml"))
    assert_refused(capsys, ["train", plan, "--steps", "8", "--checkpoint-dir", str(ck),
                            "--resume"],
                   "step-00000005 was saved with global_batch_size 8 (40 samples consumed), "
                   "this plan has 16", "resume with a plan of global_batch_size 8")


def test_the_optimizer_of_an_older_checkpoint_is_told_by_its_keys(tmp_path, capsys,
                                                                   no_launch):
    """Checkpoints saved before meta.json recorded the run: AdamW's exp_avg_sq, SGD's momentum
    (resuming one under the other used to fail as 'no intact checkpoint')."""
    _save(tmp_path / "a", run=None, optimizer="adamw")
    _save(tmp_path / "s", run=None, optimizer="sgd")
    assert saved_optimizer(verify(tmp_path / "a")) == "adamw"
    assert saved_optimizer(verify(tmp_path / "s")) == "sgd"
    ck = tmp_path / "ck"
    _save(ck / "step-00000002", step=2, run=None, optimizer="adamw")
    plan = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    assert_refused(capsys, ["train", plan, "--steps", "4", "--checkpoint-dir", str(ck),
                            "--resume", "--optimizer", "sgd"], "saved with adamw")


def test_a_changed_lr_is_named_not_refused(tmp_path):
    from autoplan.runtime.checkpoint_compat import check_settings

    _save(tmp_path / "step-00000005")
    found = verify(tmp_path / "step-00000005")
    assert check_settings(found, ADAMW) is None
    note = check_settings(found, RunSettings(**{**ADAMW.__dict__, "lr": 1e-9}))
    assert note is not None and "lr 0.001 -> 1e-09" in note


def test_loading_another_optimizers_state_is_refused_not_called_damage(tmp_path):
    """Checkpointer.load_newest took DCP's missing-key CheckpointException for damage: 'no
    intact checkpoint ... remove the damaged step-* folders' (deleting a good run)."""
    import torch.distributed as dist

    from autoplan.errors import ConfigError
    from autoplan.runtime.checkpoint import Checkpointer

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = build_meta_model(SPEC).to_empty(device="cpu")
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)
        adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randint(0, SPEC.vocab_size, (2, SPEC.seq_len))).float().mean().backward()
        adamw.step()
        Checkpointer(tmp_path, [model], [adamw]).save(2)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ConfigError) as info:
            Checkpointer(tmp_path, [model], [sgd]).load_newest(make_plan("h8-2l"), SPEC)
    finally:
        if owned:
            dist.destroy_process_group()
    message = str(info.value)
    assert "saved with adamw" in message and "--optimizer adamw" in message, message
    assert "damaged" not in message and "no intact" not in message, message
    assert (tmp_path / "step-00000002" / "meta.json").is_file()
