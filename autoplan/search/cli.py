"""`autoplan search`: find the best plan for a model, a cluster and a goal (DESIGN.md s5, s7).

Thin: parse flags into a SearchRequest, run it with a progress bar on stderr, render the ranked
table (or one JSON/YAML object) and write --out / --report. Exit 0, 2 for bad input, 3 when
nothing is feasible.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from autoplan import fsutil
from autoplan.cli_common import add_format_argument, emit, stderr_console
from autoplan.cost.runtimes import RUNTIMES, load_runtime
from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan_args import resolve_model
from autoplan.search.engine import SAMPLERS, Progress, SearchRequest, SearchResult, run_search
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
    p.add_argument("--runtime", help="price plans as this runtime runs them and keep to what it "
                   f"can run: {', '.join(('autoplan', *RUNTIMES))} or a traits YAML "
                   "(default: autoplan's own runtime on the profile's device)")
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
    p.add_argument("--out", help="directory for plan.yaml, top.yaml, trials.csv.gz, "
                   "summary.json")
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
    if args.storage is not None:
        check_storage(args.storage)
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
        worker=args.worker, runtime=load_runtime(
            args.runtime, on_cpu=profile.host.compute_slots is not None))


def check_storage(url: str) -> None:
    """Refuse, before any work, an Optuna storage file that cannot be made: journal:PATH or
    sqlite:///PATH naming a directory, lying under a file, in a missing or unwritable folder."""
    fix = "write journal:PATH or sqlite:///PATH.db"
    if url.startswith("journal:"):
        path = url.removeprefix("journal:").removeprefix("//")
    elif url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path in ("", ":memory:"):
            return
    else:
        return  # a database server: Optuna reports what is wrong with it
    if not path:
        raise ConfigError("--storage", f"{url!r} needs a path", f"{fix}, e.g. journal:study.log")
    p = Path(path)
    if p.is_dir():
        raise ConfigError("--storage", f"{path!r} is a directory", f"{fix} naming a file")
    fsutil.check_parent(p, "--storage")
    if not p.parent.is_dir():
        raise ConfigError("--storage", f"the directory {str(p.parent)!r} does not exist",
                          "create it first or give another path")


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress | None]:
    """A bar on a terminal, a line every few seconds on stderr otherwise (autoplan.progress)."""
    if not enabled:
        yield None
        return
    from autoplan.progress import tracker

    with tracker("search", stderr_console()) as progress:
        yield progress


def search_command(args: argparse.Namespace) -> int:
    req = build_request(args)
    report = report_dir(args)
    together = report is not None and args.out is not None and Path(report) == Path(args.out)
    with ExitStack() as held:
        # every output is checked and locked before the search spends any time
        if args.out:
            from autoplan.search.output import OUT_FILES, check_target

            names = OUT_FILES + (report_files() if together else ())
            check_target(args.out, args.force, names)
            held.enter_context(fsutil.output_lock(args.out, "--out"))
        if report is not None and not together:
            fsutil.check_dir_target(report, force=args.force, names=report_files(),
                                    field="--report")
            held.enter_context(fsutil.output_lock(report, "--report"))
        if report is not None:
            from autoplan.search.report import _pyplot

            _pyplot()  # matplotlib missing: refused now, not after the search
        with progress_bar() as progress:
            result = run_search(req, progress)
        data = write_results(args, result, report, together)
        from autoplan.cli_common import resolve_format
        from autoplan.display import rounded
        from autoplan.search.render import render

        # the table shows the nearest miss when it is a plan; the line on stderr always does
        view = data if (data.get("nearest") or {}).get("plan") is not None \
            else {k: v for k, v in data.items() if k != "nearest"}
        shown = rounded(data) if resolve_format(args) == "yaml" else data  # JSON: every digit
        emit(args, shown, lambda console: render(console, result, view, args.top,
                                                 wide=getattr(args, "wide", False)))
        if result.best is None:
            raise NoFeasiblePlanError(infeasible_line(data))
    return 0


def report_dir(args: argparse.Namespace) -> str | None:
    """Where --report writes: its DIR, or --out when given bare; None without --report."""
    if args.report is None:
        return None
    if args.report == "" and not args.out:
        raise ConfigError("--report", "needs a directory", "give --report DIR or --out DIR")
    return str(args.report or args.out)


def report_files() -> tuple[str, ...]:
    from autoplan.search.report import REPORT_FILES

    return tuple(REPORT_FILES)


def write_results(args: argparse.Namespace, result: SearchResult, report: str | None,
                  together: bool) -> dict[str, Any]:
    """The summary object; --out and --report written whole (nothing when nothing is
    feasible). A report that goes into --out is part of the same atomic directory."""
    from autoplan.search.output import OUT_FILES, summary, write_out

    data = summary(result, args.top)
    if result.best is None:
        return data
    if report is not None:
        from autoplan.search.report import write_report

        def add_report(folder: Path) -> None:
            write_report(result, folder, args.top, True)

        data["report"] = str(Path(report) / "report.html")
    if args.out:
        write_out(result, args.out, args.top, args.force, data,
                  also=add_report if together else None,
                  names=OUT_FILES + (report_files() if together else ()))
    if report is not None and not together:
        with fsutil.atomic_dir(report, force=args.force, names=report_files(),
                               field="--report") as tmp:
            add_report(tmp)
    for folder, names in ((args.out, OUT_FILES), (report, report_files())):
        for name in names if folder else ():
            sys.stderr.write(f"wrote {Path(folder) / name}\n")
    return data


def infeasible_line(data: dict[str, Any]) -> str:
    """One line: the candidates by reason, then the nearest miss and what it misses."""
    counts = ", ".join(f"{k} {v:,}" for k, v in data["counts"].items() if k != "feasible")
    line = f"no feasible plan among {data['candidates']:,} candidates ({counts})"
    near = data.get("nearest")
    if near:
        p = near["plan"]
        where = ""
        if p is not None:
            par = p["parallel"]
            where = (f" dp={par['dp']} tp={par['tp']} pp={par['pp']} cp={par['cp']} "
                     f"mbs={p['batch']['micro_batch_size']}")
        line += f"; nearest ({near['reason']}){where}: {'; '.join(near['misses'])}"
    return line
