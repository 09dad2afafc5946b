"""`autoplan train PLAN ...`: argument parsing and the sub-command (cli_common convention).

Outside torchrun it validates the plan and launches torchrun (launch.py); under torchrun or a
scheduler (RANK and WORLD_SIZE set) it trains in place (worker.py).
"""

from __future__ import annotations

import argparse
import os

from autoplan.cli_common import DECIMAL_NOTE, add_format_argument, amount, count, duration


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="plan YAML written by search (or by hand)")
    parser.add_argument("--nproc", type=count(None, None, example="8"), default=None,
                        help="processes to launch locally (default: the plan's world size)")
    parser.add_argument("--steps", type=count(None, None, suffixes="decimal", example="20 or 10k"),
                        default=20, help=f"optimizer steps to run (total; default 20; "
                        f"{DECIMAL_NOTE})")
    parser.add_argument("--data", default=None,
                        help="text file or folder (byte-level tokens); default synthetic tokens")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="where DCP checkpoints go: an empty or new folder, or with "
                             "--resume one of this run's")
    parser.add_argument("--checkpoint-every",
                        type=count(None, None, suffixes="decimal", example="500 or 1k"), default=0,
                        help="save every K steps (default 0: only on Ctrl-C/SIGTERM and at the end)")
    parser.add_argument("--keep-checkpoints", type=count(None, None, example="3"), default=3,
                        metavar="K",
                        help="keep the newest K checkpoints, delete older ones (default 3; 0: keep all)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest complete checkpoint in --checkpoint-dir "
                             "(another layout reshards; the same model, --optimizer, global "
                             "batch, --data and --seed, or exit 2); a folder with none starts "
                             "at step 0, as a job's first launch, unless --metrics-file holds "
                             "a run's steps")
    parser.add_argument("--metrics-file", default=None,
                        help="one JSON line per step (with --resume: continued after the "
                             "resumed step, later lines dropped)")
    parser.add_argument("--run-record", default=None, metavar="FILE",
                        help="write the run record `autoplan calibrate` reads (plan, profile, "
                             "measured and predicted step time and memory)")
    parser.add_argument("--max-restarts", type=count(None, None, example="3"), default=0,
                        help="torchrun restarts after a rank fails (resuming from a "
                             "checkpoint; with --elastic and 0: 3)")
    parser.add_argument("--elastic", action="store_true",
                        help="when the world shrinks or grows (torchrun --nnodes=MIN:MAX), "
                             "re-plan for the ranks present with the same model, batch and "
                             "space, and resume from the newest checkpoint under the new plan")
    parser.add_argument("--min-gpus", type=count(None, None, suffixes="binary", example="8"),
                        default=None, metavar="N",
                        help="with --elastic: never re-plan below N ranks (exit 3 instead)")
    parser.add_argument("--space", default=None,
                        help="with --elastic: the search space re-plans are searched in "
                             "(name or YAML; default: search's default)")
    parser.add_argument("--no-memory-check", action="store_true",
                        help="launch even when the cost model says the plan does not fit in "
                             "device memory (by default such a plan is refused, exit 3)")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--lr", type=amount("", "1e-3", suffixes=False, positive=False),
                        default=1e-3,
                        help="learning rate (with --resume: replaces the checkpoint's)")
    parser.add_argument("--max-grad-norm", type=amount("", "1.0", suffixes=False, positive=False),
                        default=0.0,
                        help="clip the global gradient norm (0: no clipping)")
    parser.add_argument("--seed", type=count(None, None, example="0"), default=0)
    parser.add_argument("--dropout", type=amount("", "0.1", suffixes=False, positive=False),
                        default=None,
                        help="residual dropout probability (default: the model's dropout, "
                             "model.dropout; 0 for parity runs)")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="process-group backend (auto: nccl with CUDA, else gloo)")
    parser.add_argument("--pg-timeout-s", type=duration("s", "120"), default=120.0,
                        help="timeout of every collective in seconds, or with a unit: 10min "
                        "(finite: a failed rank cannot hang)")
    parser.add_argument("--summary-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--launcher-pid", type=count(example="4242"), default=None,
                        help=argparse.SUPPRESS)
    add_format_argument(parser)


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="run a plan with the built-in PyTorch runtime",
        description="Train with the built-in runtime: torchrun locally, in place under a "
                    "scheduler. Ends with measured vs predicted step time, tokens/s, memory.",
    )
    add_train_arguments(parser)
    parser.set_defaults(func=train_command)
    return parser


def under_launcher() -> bool:
    """True under torchrun or a scheduler that set the rank environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def train_command(args: argparse.Namespace) -> int:
    if under_launcher():
        from autoplan.runtime.worker import run_and_report

        return run_and_report(args)
    from autoplan.runtime.launch import launch_and_report

    return launch_and_report(args)


def main(argv: list[str] | None = None) -> int:
    """`python -m autoplan.runtime.cli train ...`: the `autoplan` command itself (its parser,
    one-line errors and exit codes)."""
    from autoplan.commands import main as autoplan_main

    return autoplan_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
