"""Local launch: validate the plan, then run torchrun as a subprocess (list args, no shell).

Every user mistake (world size, plan invalid for the model, NCCL without CUDA) is one
ConfigError raised here, before any process starts. torchrun restarts all ranks up to
--max-restarts times after a failure; restarted ranks resume from the last whole checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from autoplan.errors import ConfigError, RuntimeLaunchError

log = logging.getLogger(__name__)


def resolve_backend(requested: str) -> str:
    import torch

    cuda = torch.cuda.is_available()
    if requested == "nccl" and not cuda:
        raise ConfigError("--backend", "nccl needs CUDA, which this machine does not have",
                          "use --backend gloo (or auto)")
    if requested == "auto":
        return "nccl" if cuda else "gloo"
    return requested


def preflight(args: argparse.Namespace, world_size: int):
    """Load and check the plan for `world_size` processes; returns (plan, spec, backend)."""
    from autoplan.plan import load_plan
    from autoplan.runtime.validation import check_plan

    plan = load_plan(args.plan)
    spec = plan.model_spec()
    check_plan(plan, spec, world_size)
    if args.steps < 1:
        raise ConfigError("--steps", f"got {args.steps}", "expected at least 1")
    if (args.resume or args.checkpoint_every or args.max_restarts) and not args.checkpoint_dir:
        raise ConfigError("--checkpoint-dir", "missing",
                          "--resume, --checkpoint-every and --max-restarts need a checkpoint dir")
    if args.data is not None:
        from autoplan.runtime.data import make_source

        make_source(args.data, spec.vocab_size, spec.seq_len, args.seed)  # fails early
    return plan, spec, resolve_backend(args.backend)


def worker_argv(args: argparse.Namespace, summary_file: str) -> list[str]:
    """The worker's command-line arguments (the same parser as `autoplan train`)."""
    out = [str(Path(args.plan).resolve()), "--steps", str(args.steps), "--optimizer",
           args.optimizer, "--lr", repr(args.lr), "--max-grad-norm", repr(args.max_grad_norm),
           "--seed", str(args.seed), "--dropout", repr(args.dropout), "--backend", args.backend,
           "--pg-timeout-s", repr(args.pg_timeout_s), "--checkpoint-every",
           str(args.checkpoint_every), "--summary-file", summary_file, "--format", "json"]
    for flag, value in (("--data", args.data), ("--checkpoint-dir", args.checkpoint_dir),
                        ("--metrics-file", args.metrics_file)):
        if value is not None:
            out += [flag, str(Path(value).resolve())]
    if args.resume:
        out.append("--resume")
    return out


def torchrun_command(nproc: int, max_restarts: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
            "-m", "autoplan.runtime.worker", *argv]


def _run_forwarding_sigterm(cmd: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run torchrun; a SIGTERM to us is passed on (torchrun passes it to the ranks, which
    checkpoint and stop). Worker stdout goes to our stderr: with --format json our stdout
    carries only the summary object."""
    proc = subprocess.Popen(cmd, stdout=sys.stderr, env=env)
    got = {"term": False}

    def forward(signum, frame) -> None:
        got["term"] = True
        proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        return proc.wait(), got["term"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch_and_report(args: argparse.Namespace) -> int:
    """Validate, run torchrun, and print the summary rank 0 wrote (table, json or yaml)."""
    from autoplan.cli_common import emit
    from autoplan.plan import load_plan

    nproc = args.nproc if args.nproc is not None else load_plan(args.plan).world_size
    if nproc < 1:
        raise ConfigError("--nproc", f"got {nproc}", "expected at least 1")
    preflight(args, nproc)
    with tempfile.TemporaryDirectory(prefix="autoplan-train-") as tmp:
        summary_file = os.path.join(tmp, "summary.json")
        cmd = torchrun_command(nproc, args.max_restarts, worker_argv(args, summary_file))
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        log.info("launching: %s", " ".join(cmd))
        returncode, terminated = _run_forwarding_sigterm(cmd, env)
        if terminated:
            raise RuntimeLaunchError("stopped by SIGTERM (ranks checkpointed after their "
                                     "current step when --checkpoint-dir was given)")
        if returncode != 0 or not os.path.exists(summary_file):
            raise RuntimeLaunchError(f"torchrun exited with code {returncode}; see the "
                                     "rank logs above")
        summary = json.loads(Path(summary_file).read_text())

    from autoplan.runtime.metrics import render_summary

    emit(args, summary, lambda console: render_summary(console, summary))
    return 0
