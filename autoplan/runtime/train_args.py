"""Every `autoplan train` value checked before any process starts: one ConfigError (exit 2)
that names the flag, the value and the fix. The ranks run the same checks (they parse the same
flags), so a job started by a scheduler without the CLI fails just as early."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from autoplan import fsutil
from autoplan.cli_common import check_seed
from autoplan.errors import ConfigError

MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Longest --pg-timeout-s (a week): datetime.timedelta overflows far above it."""
MIN_TIMEOUT_S = 1.0
"""Shortest --pg-timeout-s: it also bounds each rank's connect to the job's TCPStore and the
gloo rendezvous, which wait for every rank to start (ranks import torch at the same moment,
seconds apart on a busy host); at 1 ms the store's connect times out with torch's traceback."""
OUTPUT_FLAGS = ("--checkpoint-dir", "--metrics-file", "--run-record")
PATH_FLAGS = ("--data", *OUTPUT_FLAGS)
"""Path flags whose `~` is expanded here (bash leaves it in `--flag=~/x`)."""


def _number(flag: str, value: float, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False, fix: str) -> None:
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        raise ConfigError(flag, f"got {value!r}", fix)


def _output_parent(flag: str, path: str) -> Path:
    """The nearest existing ancestor of `path`, which must be a writable folder."""
    p = Path(path).absolute()
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(flag, f"{path!r}: {str(parent)!r} is a file, not a folder",
                          "choose a path inside a folder")
    if not os.access(parent, os.W_OK):
        raise ConfigError(flag, f"{path!r}: {str(parent)!r} is not writable",
                          "choose a path in a folder you can write")
    fsutil.check_creatable(parent, flag)  # root in /proc: access() says yes, mkdir fails
    return p


def expand_paths(args: argparse.Namespace) -> None:
    """Expand `~` in the path flags, in place, once: every check after this and every write
    (the launcher, the ranks it starts, a rank started by a scheduler) sees the same path."""
    for flag in PATH_FLAGS:
        name = flag[2:].replace("-", "_")
        value = getattr(args, name, None)
        if value is not None:
            if not value.strip():  # '' would mean the current folder: data, checkpoints
                raise ConfigError(flag, "got an empty path", "give a file or folder path, or "
                                  "leave the flag out")
            setattr(args, name, os.path.expanduser(value))


def check_train_args(args: argparse.Namespace) -> None:
    """Raise one ConfigError for the first bad value among the train flags (after expanding
    `~` in the path flags: expand_paths)."""
    expand_paths(args)
    if args.steps < 1:
        raise ConfigError("--steps", f"got {args.steps}", "expected at least 1")
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError("--nproc", f"got {args.nproc}", "expected at least 1")
    _number("--lr", args.lr, 0.0, math.inf, low_open=True, high_open=True,
            fix="expected a positive finite learning rate, e.g. 1e-3")
    _number("--max-grad-norm", args.max_grad_norm, 0.0, math.inf, high_open=True,
            fix="expected a finite norm >= 0 (0: no clipping)")
    if args.dropout is not None:
        _number("--dropout", args.dropout, 0.0, 1.0, high_open=True,
                fix="expected a probability in [0, 1)")
    _number("--pg-timeout-s", args.pg_timeout_s, MIN_TIMEOUT_S, MAX_TIMEOUT_S,
            fix=f"expected seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:.0f}] (at least "
                f"{MIN_TIMEOUT_S:g} s: the ranks' start-up and rendezvous wait under it; "
                "finite: a failed rank cannot hang the job)")
    for flag, value in (("--max-restarts", args.max_restarts),
                        ("--checkpoint-every", args.checkpoint_every),
                        ("--keep-checkpoints", args.keep_checkpoints)):
        if value < 0:
            raise ConfigError(flag, f"got {value}", "expected 0 or more")
    check_seed("--seed", args.seed)
    if (args.resume or args.checkpoint_every or args.max_restarts) and not args.checkpoint_dir:
        raise ConfigError("--checkpoint-dir", "missing",
                          "--resume, --checkpoint-every and --max-restarts need a checkpoint dir")
    _check_elastic(args)
    _check_paths(args)


def _check_elastic(args: argparse.Namespace) -> None:
    elastic = getattr(args, "elastic", False)
    min_gpus = getattr(args, "min_gpus", None)
    if min_gpus is not None and not elastic:
        raise ConfigError("--min-gpus", f"got {min_gpus} without --elastic", "add --elastic")
    space = getattr(args, "space", None)
    if space is not None and not elastic:
        raise ConfigError("--space", f"got {space!r} without --elastic",
                          "add --elastic (only a re-plan searches a space)")
    if not elastic:
        return
    if min_gpus is not None and min_gpus < 1:
        raise ConfigError("--min-gpus", f"got {min_gpus}", "expected at least 1")
    if not args.checkpoint_dir:
        raise ConfigError("--checkpoint-dir", "missing", "--elastic resumes a re-planned job "
                          "from its checkpoints: give --checkpoint-dir and --checkpoint-every")
    from autoplan.runtime.elastic import elastic_space
    from autoplan.search_space import load_space

    load_space(elastic_space(args))  # an unknown space fails now, not when a node dies


def _check_distinct(args: argparse.Namespace) -> None:
    """Two outputs on one path would overwrite each other (found only after training), an
    output on an input (the plan, --data) would overwrite the input, and an output inside the
    --data folder would be read as training data by the next run (a --resume)."""
    inputs = [(what, value) for what, value in (("the plan file", getattr(args, "plan", None)),
                                                ("--data", getattr(args, "data", None)))
              if value is not None]
    seen: dict[str, str] = {}
    for flag in OUTPUT_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None:
            continue
        key = os.path.normpath(Path(value).absolute())
        if key in seen:
            raise ConfigError(flag, f"{value!r} is also given to {seen[key]}",
                              "give each output its own path")
        seen[key] = flag
        for what, source in inputs:
            if key == os.path.normpath(Path(source).absolute()) or _same_file(value, source):
                raise ConfigError(flag, f"{value!r} is {what}", "give the output another path "
                                  "(an output never replaces an input)")
        data = getattr(args, "data", None)
        if data is not None and _inside(value, data):
            raise ConfigError(flag, f"{value!r} is inside the --data folder {data!r}",
                              "give the output a path outside it (every file there is read as "
                              "training data, so a --resume would train on this output)")


def _inside(path: str, folder: str) -> bool:
    """Whether `path` (existing or not) lies below the folder `folder`, links resolved."""
    if not os.path.isdir(folder):
        return False
    inner, outer = os.path.realpath(path), os.path.realpath(folder)
    return inner != outer and os.path.commonpath([inner, outer]) == outer


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (or unreadable): not one file
        return False


def _check_paths(args: argparse.Namespace) -> None:
    _check_distinct(args)
    if args.checkpoint_dir is not None:
        d = Path(args.checkpoint_dir)
        if d.exists() and not d.is_dir():
            raise ConfigError("--checkpoint-dir", f"{args.checkpoint_dir!r} is a file",
                              "name a folder (it is created if missing)")
        if not d.exists():
            _output_parent("--checkpoint-dir", args.checkpoint_dir)
        elif not os.access(d, os.W_OK):
            raise ConfigError("--checkpoint-dir", f"{args.checkpoint_dir!r} is not writable",
                              "choose a folder you can write")
        elif not _resuming(args) and not under_restart():
            _check_no_checkpoints(args.checkpoint_dir)
    if args.metrics_file is not None:
        _check_metrics_file(args)
    if args.run_record is not None:
        r = Path(args.run_record)
        if r.is_dir():
            raise ConfigError("--run-record", f"{args.run_record!r} is a folder", "name a file")
        if r.exists() and not under_restart():
            raise ConfigError("--run-record", f"{args.run_record!r} already exists",
                              "choose another path (run records are never overwritten)")
        _output_parent("--run-record", args.run_record)


def _check_metrics_file(args: argparse.Namespace) -> None:
    """A new file, or with --resume (or in a restart) the file an earlier run wrote: every
    record in it is kept up to the resumed step and the rest dropped, so a file that is not
    this runtime's step records (another output, the plan, a typo) is refused untouched."""
    from autoplan.runtime.metrics import metrics_file_problem

    path = args.metrics_file
    m = Path(path)
    if m.is_dir():
        raise ConfigError("--metrics-file", f"{path!r} is a folder", "name a file")
    if m.exists() and not m.is_file():
        raise ConfigError("--metrics-file", f"{path!r} is not a regular file",
                          "name a file (a new one, or with --resume this run's)")
    if m.exists() and not _resuming(args) and not under_restart():
        raise ConfigError("--metrics-file", f"{path!r} already exists",
                          "pass --resume to continue it, or choose another path")
    if m.exists():
        problem = metrics_file_problem(m)
        if problem:
            raise ConfigError("--metrics-file", f"{path!r} is not a metrics file of autoplan "
                              f"train ({problem}); --resume would cut it to this run's steps",
                              "give another path (a new file, or the --metrics-file the "
                              "resumed run wrote)")
    _output_parent("--metrics-file", path)


def _check_no_checkpoints(directory: str) -> None:
    """A fresh run saves step-N folders beside another run's, replaces those of the same
    step, prunes the newest-K of both together, and a later --resume picks whichever is
    newest: refuse before anything starts."""
    from autoplan.runtime.checkpoint_files import complete_dirs

    found = complete_dirs(Path(directory))
    if found:
        more = f", {len(found) - 1} more" if len(found) > 1 else ""
        raise ConfigError("--checkpoint-dir", f"{directory} holds checkpoints "
                          f"({found[0].name}{more})", "pass --resume to continue that run or "
                          "choose an empty directory")


def _resuming(args: argparse.Namespace) -> bool:
    """--resume, or --elastic (a world change restarts the workers without counting a torchrun
    restart, and they must pick up the checkpoints)."""
    return bool(args.resume or getattr(args, "elastic", False))


def under_restart() -> bool:
    """A torchrun restart re-runs the ranks' checks on the files the first attempt wrote."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
