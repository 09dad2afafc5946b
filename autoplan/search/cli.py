"""`autoplan search`: find the best plan for a model, a cluster and a goal (DESIGN.md s5, s7).

Thin: parse flags into a SearchRequest, run it with a progress bar on stderr, render the ranked
table (or one JSON/YAML object) and write --out / --report. Exit 0, 2 for bad input, 3 when
nothing is feasible.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autoplan.cli_common import add_format_argument, emit, stderr_console
from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan_args import resolve_model
from autoplan.search.engine import SAMPLERS, Progress, SearchRequest, run_search
from autoplan.search.space import parse_gpu_counts
from autoplan.search.targets import OBJECTIVES, Targets
from autoplan.search_space import load_space


def register(sub: Any) -> None:
    p = sub.add_parser("search", help="search the plan space for the best plan",
                       description="Search parallelism, memory and batch knobs with the cost "
                       "model; rank the plans that fit and meet the targets.")
    p.add_argument("--model", required=True, help="preset, model YAML or HF config.json")
    p.add_argument("--cluster", required=True, help="hardware profile name or path")
    p.add_argument("--num-gpus", required=True,
                   help="GPU count N, a list A,B,C, or a range A..B (powers of two and whole "
                   "nodes in it): the search also picks the count")
    p.add_argument("--global-batch-size", type=int, required=True, help="sequences per step")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")
    p.add_argument("--space", default="default", help="search space name or YAML path")
    p.add_argument("--objective", default="throughput",
                   help=f"{'|'.join(OBJECTIVES)}, or several comma-separated for a Pareto front")
    p.add_argument("--max-step-time-s", type=float, help="constraint: step time at most X s")
    p.add_argument("--min-tokens-per-s", type=float, help="constraint: at least Y tokens/s")
    p.add_argument("--deadline-days", type=float, help="constraint: train --train-tokens in D days")
    p.add_argument("--train-tokens", type=float, help="token budget (cost in GPU-hours)")
    p.add_argument("--sampler", choices=SAMPLERS,
                   help="default: exhaustive when the space is enumerable, else tpe")
    p.add_argument("--trials", type=int, default=300, help="Optuna trials (default 300)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--storage", help="Optuna storage: sqlite:///x.db, an RDB URL or journal:PATH")
    p.add_argument("--study", help="study name in --storage (created or resumed)")
    p.add_argument("--worker", type=int, default=0,
                   help="worker index when several processes share one study")
    p.add_argument("--top", type=int, default=10, help="plans to show and keep (default 10)")
    p.add_argument("--out", help="directory for plan.yaml, top.yaml, trials.csv, summary.json")
    p.add_argument("--force", action="store_true", help="replace files in --out")
    p.add_argument("--report", nargs="?", const="", default=None, metavar="DIR",
                   help="write PNG plots and an HTML page (default DIR: --out)")
    p.add_argument("--wide", action="store_true",
                   help="table: every column in full (default: fit the terminal, 80 columns)")
    add_format_argument(p)
    p.set_defaults(func=search_command)


def build_request(args: argparse.Namespace) -> SearchRequest:
    model = resolve_model(args)
    model_ref: Any = args.model if args.model in PRESETS and not args.seq_len else model
    profile = load_profile(args.cluster)
    if args.global_batch_size < 1:
        raise ConfigError("--global-batch-size", f"got {args.global_batch_size}",
                          "expected a positive integer")
    if args.top < 1:
        raise ConfigError("--top", f"got {args.top}", "expected a positive integer")
    targets = Targets(
        objectives=tuple(o.strip() for o in args.objective.split(",") if o.strip()),
        max_step_time_s=args.max_step_time_s, min_tokens_per_s=args.min_tokens_per_s,
        deadline_days=args.deadline_days, train_tokens=args.train_tokens)
    return SearchRequest(
        model=model, model_ref=model_ref, profile=profile, profile_ref=args.cluster,
        space=load_space(args.space), gpu_counts=parse_gpu_counts(args.num_gpus,
                                                                   profile.gpus_per_node),
        global_batch_size=args.global_batch_size, targets=targets, sampler=args.sampler,
        trials=args.trials, seed=args.seed, storage=args.storage, study=args.study,
        worker=args.worker)


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("search: {task.description}"), BarColumn(), MofNCompleteColumn(),
             TimeElapsedColumn(), console=stderr_console(), transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def update(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        yield update


def search_command(args: argparse.Namespace) -> int:
    req = build_request(args)
    if args.report is not None and args.report == "" and not args.out:
        raise ConfigError("--report", "needs a directory", "give --report DIR or --out DIR")
    if args.out:
        from autoplan.search.output import check_target

        check_target(args.out, args.force)  # refuse before spending time
    with progress_bar(sys.stderr.isatty()) as progress:
        result = run_search(req, progress)
    from autoplan.search.output import summary, write_out

    data = summary(result, args.top)
    if result.best is not None:
        if args.out:
            write_out(result, args.out, args.top, args.force, data)
        if args.report is not None:
            from autoplan.search.report import write_report

            data["report"] = str(write_report(result, args.report or args.out, args.top,
                                              args.force))
    from autoplan.cli_common import resolve_format
    from autoplan.display import rounded
    from autoplan.search.render import render

    shown = rounded(data) if resolve_format(args) == "yaml" else data  # JSON keeps every digit
    emit(args, shown, lambda console: render(console, result, data, args.top,
                                             wide=getattr(args, "wide", False)))
    if result.best is None:
        raise NoFeasiblePlanError(infeasible_line(data))
    return 0


def infeasible_line(data: dict[str, Any]) -> str:
    counts = ", ".join(f"{k} {v:,}" for k, v in data["counts"].items() if k != "feasible")
    line = f"no feasible plan among {data['candidates']:,} candidates ({counts})"
    near = data.get("nearest")
    if near:
        p = near["plan"]
        par = p["parallel"]
        line += (f"; nearest: dp={par['dp']} tp={par['tp']} pp={par['pp']} cp={par['cp']} "
                 f"{'; '.join(near['misses'])}")
    return line

