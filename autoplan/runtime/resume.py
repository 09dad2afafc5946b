"""What `train --resume` starts from, decided before any rank trains: the launcher's checks and,
under a scheduler that no launcher checked, every rank's. A checkpoint already at --steps is a
finished run: nothing trains and the command exits 0 (a job resubmitted or requeued after it
ended), under --elastic too (elastic_trained_already); the checkpoint's own checks are
checkpoint_compat's."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoplan.errors import ConfigError


def resume_preflight(args: argparse.Namespace, plan, spec,
                     data_fingerprint: dict | None = None) -> str | None:
    """The launcher, before any rank starts: removes the temporaries of a save cut short, then
    check_resume. Returns check_resume's line of a run already trained (launch nothing)."""
    from autoplan.runtime.checkpoint_files import clean_temporaries

    if not args.checkpoint_dir:
        return None  # a fresh run into a folder of checkpoints: refused by check_train_args
    clean_temporaries(args.checkpoint_dir)
    return check_resume(args, plan, spec, data_fingerprint)


def check_resume(args: argparse.Namespace, plan, spec,
                 data_fingerprint: dict | None = None) -> str | None:
    """--resume (or --elastic) refuses a folder without an intact checkpoint, a hostile one,
    one of another model, optimizer, batch, data (its path or, by `data_fingerprint`, its
    content: data_preflight's, scanned here when not given) or seed, and one past --steps.
    Returns, with --resume, the line of a checkpoint at --steps (trained_already); else None.
    Reads only: the ranks of a job on several nodes all make these decisions, the same ones."""
    from autoplan.runtime.checkpoint_compat import (
        RunSettings,
        check_resumable,
        check_settings,
        check_steps,
        trained_already,
    )
    from autoplan.runtime.checkpoint_files import newest_intact
    from autoplan.runtime.launch import data_preflight

    if not args.checkpoint_dir or not (args.resume or getattr(args, "elastic", False)):
        return None
    found, skipped = newest_intact(args.checkpoint_dir)
    if found is None and skipped:
        raise ConfigError("--checkpoint-dir", f"no intact checkpoint in {args.checkpoint_dir} "
                          f"({skipped[0]})", "remove the damaged step-* folders, or start "
                          "without --resume in a new --checkpoint-dir")
    if found is None:
        if args.resume:
            check_fresh_start(args)
        return None  # a job's first launch (exported jobs always pass --resume): step 0
    check_resumable(found, plan, spec)
    if data_fingerprint is None:
        data_fingerprint = data_preflight(args, spec)
    check_settings(found, RunSettings.of(args, plan, data_fingerprint=data_fingerprint))
    done = (trained_already(found.step, args.steps, args.checkpoint_dir) if args.resume
            else None)
    if done is None:
        check_steps(found.step, args.steps)
    return done


def elastic_trained_already(args: argparse.Namespace) -> str | None:
    """Under --elastic with --resume, every rank before the round's re-plan: check_resume's
    line of a checkpoint at --steps, on the plan file's own plan (a re-plan keeps its model,
    global batch and precision, all that check reads), so the round ends before it re-plans,
    hosts a store or idles a rank, as the non-elastic path does. None for any other step or
    no checkpoint, left to the round's own resume: a membership change starts a round without
    counting a restart, and one after a round that saved nothing starts at step 0 (which
    check_fresh_start would refuse over its metrics). Not in a restart (_resume ends one)."""
    from autoplan.plan_files import load_plan
    from autoplan.runtime.checkpoint_files import newest_intact
    from autoplan.runtime.launch import run_dropout
    from autoplan.runtime.train_args import under_restart

    if not (args.resume and args.checkpoint_dir) or under_restart():
        return None
    found, _ = newest_intact(args.checkpoint_dir)
    if found is None or found.step != args.steps:
        return None
    plan = run_dropout(args, load_plan(args.plan))
    return check_resume(args, plan, plan.model_spec())


def check_fresh_start(args: argparse.Namespace) -> None:
    """--resume that finds no checkpoint starts the run at step 0, as a scheduled job's first
    launch must (export/launch.py train_argv always passes --resume). Not over another run's
    --metrics-file: starting over would cut its history (a mistyped --checkpoint-dir)."""
    metrics = Path(args.metrics_file) if args.metrics_file else None
    if metrics is not None and metrics.is_file() and metrics.stat().st_size > 0:
        raise ConfigError("--resume", f"--checkpoint-dir {args.checkpoint_dir} holds no "
                          f"checkpoint (no step-* folder), but --metrics-file {metrics} holds "
                          "a run's steps", "check the --checkpoint-dir path, or give a new "
                          "--metrics-file to start a new run")
