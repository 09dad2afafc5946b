"""`autoplan search`: find the best plan for a model, a cluster and a goal (DESIGN.md s5, s7).

Thin: parse flags into a SearchRequest, run it with a progress bar on stderr, render the ranked
table (or one JSON/YAML object) and write --out / --report. Exit 0, 2 for bad input, 3 when
nothing is feasible.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from autoplan import fsutil
from autoplan.cli_common import (
    add_format_argument,
    amount,
    check_seed,
    count,
    duration,
    emit,
    stderr_console,
)
from autoplan.cost.runtimes import RUNTIMES, load_runtime
from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.plan_args import SEQ_LEN, SEQ_LEN_HELP, resolve_model
from autoplan.plan_files import plan_model_ref
from autoplan.search.batch_range import check_batch_range
from autoplan.search.engine import (
    SAMPLERS,
    Progress,
    SearchRequest,
    SearchResult,
    run_search,
    type_requests,
)
from autoplan.search.precisions import check_runnable
from autoplan.search.ranges import parse_batch_sizes, typed_range
from autoplan.search.request_args import common_format, gpu_types, with_precisions
from autoplan.search.summary import (
    best_by_cluster,
    caveats,
    infeasible_line,
    resumed_lines,
    study_counts,
    table_infeasible_line,
)
from autoplan.search.targets import MEMORY_SLACKS, OBJECTIVES, Targets
from autoplan.search_space import load_space

log = logging.getLogger(__name__)

DEFAULT_TRIALS = 300
MAX_TRIALS = 100_000
"""Largest --trials (a TPE study's time per trial grows with the trials before it: past this it
runs for hours); a larger count is a typo."""


def register(sub: Any) -> None:
    p = sub.add_parser("search", help="search the plan space for the best plan",
                       description="Search parallelism, memory and batch knobs with the cost "
                       "model; rank the plans that fit and meet the targets.")
    p.add_argument("--model", required=True,
                   help="preset, model YAML, HF config.json or the folder holding one")
    p.add_argument("--cluster", required=True,
                   help="hardware profile name or path, or several comma-separated GPU types "
                   "searched together (e.g. a100-sxm4-80gb,h100-sxm-80gb,h200-sxm-141gb)")
    p.add_argument("--price", help="US dollars per GPU-hour by profile, NAME=USD,... (default: "
                   "each profile's price_per_gpu_hour, an example list price)")
    p.add_argument("--num-gpus", required=True,
                   help="GPU count N, a list A,B,C, or a range A..B (powers of two and whole "
                   "nodes in it): the search also picks the count (1k = 1024)")
    p.add_argument("--global-batch-size", required=True,
                   help="sequences (not tokens) per step, or a range A..B the search picks "
                   "from (powers of two and dp times a power of two inside it); a 4M-token "
                   "batch at seq 8192 is 512 (1k = 1024)")
    p.add_argument("--seq-len", type=SEQ_LEN, help=SEQ_LEN_HELP)
    p.add_argument("--space", default="default", help="search space name or YAML path")
    p.add_argument("--precision", metavar="LIST",
                   help="training precisions to search, comma-separated (bf16, fp16, fp32, "
                        "fp8) or auto; replaces the space's precision list (default: the "
                        "space's, auto in the shipped ones: bf16, and fp8 where the GPU has it)")
    p.add_argument("--runtime", help="price plans as this runtime runs them and keep to what it "
                   f"can run: {', '.join(('autoplan', *RUNTIMES))} or a traits YAML "
                   "(default: autoplan's own runtime on the profile's device)")
    p.add_argument("--objective", default="throughput",
                   help=f"{'|'.join(OBJECTIVES)}, or several comma-separated for a Pareto front")
    p.add_argument("--max-step-time-s", type=duration("s", "30"),
                   help="constraint: step time at most X s (or with a unit: 100ms, 2min)")
    p.add_argument("--min-tokens-per-s", type=amount("tokens/s", "1e6 or 1M"),
                   help="constraint: at least Y tokens/s (1M = 1e6)")
    p.add_argument("--deadline-days", type=duration("days", "7"),
                   help="constraint: train --train-tokens in D days (or with a unit: 36h, 2w)")
    p.add_argument("--train-tokens", type=amount("tokens", "1e12 or 1T"),
                   help="token budget (cost in GPU-hours), e.g. 1e12 or 1T (k, M, B or G, T "
                   "are powers of 1000)")
    p.add_argument("--memory-slack", default="median", metavar="|".join(MEMORY_SLACKS),
                   help="allocator slack a plan must fit with: median (the cost model's, "
                        "2.05%% of allocated) or p75 (5.16%%: leaves out the plans marked GiB!)")
    p.add_argument("--sampler", choices=SAMPLERS,
                   help="default: exhaustive when the space is enumerable, else tpe")
    p.add_argument("--trials", type=count(high=MAX_TRIALS), default=None,
                   help=f"Optuna trials (default {DEFAULT_TRIALS}; not with --sampler "
                        "exhaustive, which scores every candidate); with --storage, the study's "
                        "total: a resumed study samples only the trials it lacks")
    p.add_argument("--seed", type=count(None, None, example="0"), default=0,
                   help="sampler seed (default 0)")
    p.add_argument("--storage", help="Optuna storage: sqlite:///x.db, an RDB URL or journal:PATH")
    p.add_argument("--study", help="study name in --storage (created or resumed); with "
                   "several --cluster types, one study per type, named STUDY/TYPE")
    p.add_argument("--worker", type=count(None, None, example="0"), default=0,
                   help="worker index when several processes share one study")
    p.add_argument("--top", type=count(None, None, example="10"), default=10,
                   help="plans to show and keep (default 10)")
    p.add_argument("--out", help="directory for plan.yaml, top.yaml, trials.csv.gz, "
                   "summary.json")
    p.add_argument("--force", action="store_true", help="replace files in --out")
    p.add_argument("--all-trials", action="store_true",
                   help="trials.csv.gz in --out holds every scored candidate (default: the "
                        "best 2,000 by each objective, the Pareto front and the 2,000 nearest "
                        "misses)")
    p.add_argument("--report", nargs="?", const="", default=None, metavar="DIR",
                   help="write report.html, one page with its plots inline (default DIR: "
                   "--out)")
    p.add_argument("--wide", action="store_true",
                   help="table: every column in full (default: fit the terminal, 80 columns)")
    add_format_argument(p)
    p.set_defaults(func=search_command)


def build_request(args: argparse.Namespace) -> SearchRequest:
    model = resolve_model(args)
    model_ref = plan_model_ref(args.model, model)
    types = gpu_types(args.cluster, args.num_gpus, getattr(args, "price", None))
    profile = types[0].profile
    gbs, gbs_max = parse_batch_sizes(str(args.global_batch_size))
    if args.top < 1:
        raise ConfigError("--top", f"got {args.top}", "expected a positive integer")
    check_seed("--seed", args.seed)
    check_seed("--worker", args.worker)
    if args.storage is None and (args.study is not None or args.worker):
        flag, value = ("--study", args.study) if args.study is not None else (
            "--worker", args.worker)
        raise ConfigError(flag, f"got {value!r} without --storage",
                          "workers share a study through --storage: give --storage and --study")
    if getattr(args, "all_trials", False) and not getattr(args, "out", None):
        raise ConfigError("--all-trials", "given without --out",
                          "it sets what trials.csv.gz in --out holds: give --out DIR too")
    if args.storage is not None:
        from autoplan.search.storage import check_storage

        check_storage(args.storage)
    if args.study is not None:
        from autoplan.search.storage import check_study_name

        suffix = max((len(t.ref) + 1 for t in types), default=0) if len(types) > 1 else 0
        check_study_name(args.study, suffix, " with /TYPE added per GPU type" if suffix else "")
    if args.sampler == "exhaustive" and args.trials is not None:
        raise ConfigError("--trials", f"got {args.trials} with --sampler exhaustive",
                          "drop --trials (exhaustive scores every candidate), or choose "
                          "--sampler tpe, nsga2 or random")
    targets = Targets(
        objectives=tuple(o.strip() for o in args.objective.split(",") if o.strip()),
        max_step_time_s=args.max_step_time_s, min_tokens_per_s=args.min_tokens_per_s,
        deadline_days=args.deadline_days, train_tokens=args.train_tokens,
        memory_slack=getattr(args, "memory_slack", "median"))  # `tune` builds its own args
    if len(types) > 1 and "cost" in targets.objectives:
        unpriced = [t.ref for t in types if t.profile.price_per_gpu_hour is None]
        if unpriced:
            raise ConfigError("--price", f"{', '.join(unpriced)} has no price_per_gpu_hour",
                              f"give --price {unpriced[0]}=USD to compare cost across types")
    precision = getattr(args, "precision", None)  # `tune` builds its own args
    space = with_precisions(load_space(args.space), precision)
    check_runnable(space, [(t.ref, t.profile) for t in types], precision, args.space)
    req = SearchRequest(
        model=model, model_ref=model_ref, profile=profile,
        profile_ref=",".join(t.ref for t in types), space=space,
        gpu_counts=tuple(sorted({n for t in types for n in t.gpu_counts})),
        global_batch_size=gbs, targets=targets, sampler=args.sampler,
        trials=DEFAULT_TRIALS if args.trials is None else args.trials, seed=args.seed,
        storage=args.storage, study=args.study,
        worker=args.worker, runtime=load_runtime(
            args.runtime, on_cpu=profile.is_cpu),
        global_batch_size_max=gbs_max if gbs_max != gbs else None,
        types=types if len(types) > 1 else (), gpu_range=typed_range(str(args.num_gpus)))
    check_batch_range(req.space, req.gpu_counts, req.batch)  # before --out is locked
    if len(types) == 1:
        return dataclasses.replace(req, gpu_counts=types[0].gpu_counts, profile_ref=types[0].ref)
    precisions = {t.ref: s.space.precision for t, s in zip(types, type_requests(req),
                                                           strict=True)}
    if len(set(precisions.values())) > 1:
        raise ConfigError("--cluster", "the GPU types train in different precisions (" + ", ".join(
            f"{k} {'/'.join(p.value for p in v)}" for k, v in precisions.items()) + ")",
            "search them one at a time, or give --precision" + common_format(types))
    return req


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress | None]:
    """A bar on a terminal, a line every few seconds on stderr otherwise (autoplan.progress);
    the closing "done" line only when the search finished."""
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
        studies = study_counts(result)
        data = write_results(args, result, report, together, studies)
        from autoplan.cli_common import resolve_format
        from autoplan.display import rounded
        from autoplan.search.render import render

        # the table shows the nearest miss when it is a plan; the line on stderr always does
        view = data if (data.get("nearest") or {}).get("plan") is not None \
            else {k: v for k, v in data.items() if k != "nearest"}
        shown = rounded(data) if resolve_format(args) == "yaml" else data  # JSON: every digit
        def table(console: Any) -> None:
            for line in resumed_lines(studies):  # above the sampled search's header line
                console.print(line, markup=False, soft_wrap=True)
            render(console, result, view, args.top, wide=getattr(args, "wide", False))

        emit(args, shown, table)
        if result.best is None:
            raise NoFeasiblePlanError(table_infeasible_line(data) if resolve_format(args)
                                      == "table" else infeasible_line(data))
    note = trials_note(args, req)
    if note:  # last, so that a search that fails still says one line
        sys.stderr.write(f"autoplan search: note: {note}\n")
    return 0


def trials_note(args: argparse.Namespace, req: SearchRequest) -> str | None:
    """Why --trials went unused when no --sampler was given and the space is small enough to
    score whole (the default sampler is then exhaustive); None when it was used. With --storage
    the search refuses the pair in one line of its own."""
    if args.trials is None or args.sampler is not None or args.storage is not None:
        return None
    subs = type_requests(req)
    whole = [sub.profile_ref for sub in subs if sub.pick_sampler() == "exhaustive"]
    if not whole:
        return None
    where = f" for {', '.join(whole)}" if len(whole) < len(subs) else ""
    return (f"--trials {args.trials} was ignored{where}: the space is small enough to score "
            "every candidate (the exhaustive sampler); add --sampler tpe, nsga2 or random to "
            f"sample {args.trials} trials")


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
                  together: bool, studies: list[dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """The summary object; --out and --report written whole (nothing when nothing is
    feasible). A report that goes into --out is part of the same atomic directory."""
    from autoplan.search.output import OUT_FILES, summary, write_out

    data = summary(result, args.top)
    if studies:
        data["studies"] = studies
    if result.request.types:
        data["by_cluster"] = best_by_cluster(result)
    data |= caveats(result, data)
    if result.best is None:
        return data
    if report is not None:
        from autoplan.search.report import write_report

        def add_report(folder: Path) -> None:
            write_report(result, folder, args.top, True)

        data["report"] = str(Path(report) / "report.html")
    if report is not None and not together:
        # the report is rendered before --out is committed: a report that fails leaves --out
        # unwritten (a rerun is not refused), and both are renamed into place together
        with fsutil.atomic_dir(report, force=args.force, names=report_files(),
                               field="--report") as tmp:
            add_report(tmp)
            if args.out:
                write_out(result, args.out, args.top, args.force, data, stale=report_files(),
                          all_trials=getattr(args, "all_trials", False))
    elif args.out:
        # with --force, --out holds this search alone: an older run's report.html goes too
        write_out(result, args.out, args.top, args.force, data,
                  also=add_report if together else None,
                  names=OUT_FILES + (report_files() if together else ()),
                  stale=() if together else report_files(),
                  all_trials=getattr(args, "all_trials", False))
    for folder, names in ((args.out, OUT_FILES), (report, report_files())):
        if folder:
            for name in names:
                sys.stderr.write(f"wrote {Path(folder) / name}\n")
    return data
