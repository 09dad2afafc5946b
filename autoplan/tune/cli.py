"""`autoplan tune`: run the cost model's best candidates for a few steps and keep the fastest."""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from autoplan import fsutil
from autoplan.cli_common import (
    add_format_argument,
    amount,
    count,
    duration,
    emit,
    json_text,
    stderr_console,
)
from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, plan_file_paths, plan_from_dict, plan_to_dict
from autoplan.plan_args import SEQ_LEN, SEQ_LEN_HELP
from autoplan.yaml_io import dump_yaml, read_yaml, show, write_text_atomic

OUT_FILES = ("plan.yaml", "trials.csv", "summary.json")


def register(sub: Any) -> None:
    p = sub.add_parser("tune", help="measure the best candidate plans with short real runs",
                       description="Take the search's top plans (and any --plan), run each for "
                       "a few steps with the built-in runtime on this machine, prune clearly "
                       "slower ones, and keep the measured best; every run feeds calibration.")
    p.add_argument("--model", required=True)
    p.add_argument("--cluster", required=True, help="profile of this machine (name or path)")
    p.add_argument("--num-gpus", type=count(suffixes="binary", example="8"), required=True,
                   help="ranks/GPUs on this machine (one count)")
    p.add_argument("--global-batch-size", type=count(suffixes="binary", example="8"),
                   required=True, help="sequences (not tokens) per optimizer step")
    p.add_argument("--seq-len", type=SEQ_LEN, help=SEQ_LEN_HELP)
    p.add_argument("--space", default="small-cpu", help="search space (default small-cpu)")
    p.add_argument("--top", type=count(None, None, example="8"), default=8,
                   help="candidates from the search (default 8)")
    p.add_argument("--plan", action="append", default=[], help="also run this plan (repeatable)")
    p.add_argument("--steps", type=count(None, None, example="8"), default=8,
                   help="steps per trial (default 8)")
    p.add_argument("--budget-s", type=duration("s", "600"), default=600.0,
                   help="whole tune (default 600 s; or with a unit: 10min, 2h)")
    p.add_argument("--trial-timeout-s", type=duration("s", "180"), default=180.0,
                   help="a trial running longer is recorded as a hang (default 180 s; or with "
                   "a unit: 3min)")
    p.add_argument("--prune-ratio", type=amount("", "1.5", suffixes=False, positive=False),
                   default=1.5,
                   help="prune a trial slower than this times the best (default 1.5)")
    p.add_argument("--storage", help="Optuna storage to resume from: sqlite:///x.db or journal:PATH")
    p.add_argument("--study", help="study name in --storage (resumed only by the same tune)")
    p.add_argument("--out", help="directory for plan.yaml, trials.csv and summary.json; the "
                   "trial runs go to its trials/ and runs/ (without --out, to a temporary "
                   "directory removed when the tune ends)")
    p.add_argument("--force", action="store_true", help="replace files in --out")
    p.add_argument("--dry-run", action="store_true", help="print the trials and their budget")
    add_format_argument(p)
    p.set_defaults(func=tune_command)


def _validate(args: argparse.Namespace) -> None:
    for name in ("top", "steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", f"got {getattr(args, name)}",
                              "expected a positive integer")
    if args.steps < 3:
        raise ConfigError("--steps", f"got {args.steps}", "need at least 3 (1 warm-up, 2 timed)")
    for flag, value in (("--budget-s", args.budget_s), ("--trial-timeout-s", args.trial_timeout_s)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(flag, f"got {value}", "give a positive number of seconds")
    if not (math.isfinite(args.prune_ratio) and args.prune_ratio > 1):
        raise ConfigError("--prune-ratio", f"got {args.prune_ratio}",
                          "expected a finite number more than 1")
    if bool(args.storage) != bool(args.study):
        raise ConfigError("--storage", "needs --study (and the reverse)", "give both or neither")
    if args.study:
        from autoplan.search.storage import check_study_name

        check_study_name(args.study)  # a name no storage holds: refused before any is touched
    if args.storage:
        from autoplan.search.storage import check_storage

        check_storage(args.storage)  # a file that is not a journal: refused before any work
    if args.out:
        fsutil.check_dir_target(args.out, force=args.force, names=OUT_FILES)
    args.device = this_device(args.cluster)


def this_device(cluster: str) -> str:
    """The device tune's runs train on here, refused when --cluster's profile describes
    another: tune measures this machine, and calibrating a GPU profile on CPU runs (or one GPU
    model's on another's) would fit it to the wrong hardware (calibrate.check_runs)."""
    from autoplan.calibrate import device_model, device_token
    from autoplan.hardware import load_profile
    from autoplan.runtime.machine import local_device

    here = local_device()
    want = device_model(load_profile(cluster, "--cluster"))
    if device_token(here) != want:
        raise ConfigError("--cluster", f"profile {show(cluster)} describes {want}, but this "
                          f"machine trains on {here}", "give this machine's profile "
                          "(`autoplan profile` measures one; cpu-gloo on a CPU host)")
    return here


LAYOUT_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "etp", "dp_shard", "mbs", "schedule", "vpp")
"""The columns that make a layout: the plan's degrees, micro-batch size and pipeline shape."""


def search_candidates(args: argparse.Namespace) -> list[tuple[Plan, str]]:
    """The search's best plans, one per layout first; NoFeasiblePlanError (exit 3) naming the
    nearest miss when nothing is feasible."""
    from autoplan.search.cli import build_request
    from autoplan.search.engine import run_search
    from autoplan.search.output import plans, summary
    from autoplan.search.summary import infeasible_line

    ns = argparse.Namespace(
        model=args.model, cluster=args.cluster, num_gpus=str(args.num_gpus),
        global_batch_size=args.global_batch_size, seq_len=args.seq_len, space=args.space,
        objective="throughput", max_step_time_s=None, min_tokens_per_s=None,
        deadline_days=None, train_tokens=None, sampler=None, trials=300, seed=0, storage=None,
        study=None, worker=0, top=args.top, runtime=None)  # autoplan's own runtime: tune runs it
    result = run_search(build_request(ns))
    if result.best is None:
        raise NoFeasiblePlanError(infeasible_line(summary(result, 1)))
    ranks = picked_ranks(result.scored.cols, result.order, args.top)
    built = plans(result, result.order[ranks])  # Plans for the picked rows only
    return [(p, f"model rank {r + 1}") for p, r in zip(built, ranks, strict=True)]


def picked_ranks(cols: dict[str, np.ndarray], order: np.ndarray, top: int) -> np.ndarray:
    """Positions in `order` (best first) of the plans to run: the best of each layout first
    (the cost model's near-ties, e.g. ZeRO-1 vs ZeRO-2 on a few ranks, teach a tune little),
    then the rest in rank order, `top` in all; judged on the columns, without building Plans."""
    names = [c for c in LAYOUT_COLUMNS if c in cols]
    keys = np.stack([np.asarray(cols[c])[order].astype(np.int64) for c in names], axis=1)
    _, first = np.unique(keys, axis=0, return_index=True)
    first = np.sort(first)[:top]
    if len(first) == top:
        return first
    rest = np.setdiff1d(np.arange(len(order)), first)[:top - len(first)]
    return np.concatenate([first, rest]).astype(np.int64)


def tune_command(args: argparse.Namespace) -> int:
    from autoplan.tune.runner import Stopped, stop_on_signals

    _validate(args)
    out = Path(args.out) if args.out else None
    try:
        # SIGTERM/SIGHUP unwind like Ctrl-C: the running trial's child is killed and the
        # --out lock and the temporary trial directory are removed on the way out
        with stop_on_signals(), ExitStack() as held:
            if out and not args.dry_run:  # one tune per --out: trials/ and runs/ are its work
                held.enter_context(fsutil.output_lock(out, "--out"))
            candidates = _candidates(args)
            if args.dry_run:
                return _dry_run(args, candidates)
            workdir = out or Path(held.enter_context(
                tempfile.TemporaryDirectory(prefix="autoplan-tune-")))
            return _tune(args, out, workdir, candidates)
    except Stopped as stop:
        sys.stderr.write(f"autoplan tune: stopped by {stop}; the running trial was killed and "
                         "counts as interrupted (a --storage study runs it again on resume)\n")
        return 128 + stop.signum


def _tune(args: argparse.Namespace, out: Path | None, workdir: Path,
          candidates: list[Any]) -> int:
    from autoplan.tune.study import run_tune

    cfg = _config(args)
    console = stderr_console()
    console.print(f"tune: {len(candidates)} plans, {args.steps} steps each, "
                  f"budget {args.budget_s:.0f} s")
    result = run_tune(candidates, cfg, workdir, _trial_printer(console, len(candidates)))
    by_key = {c.key: c for c in candidates}
    calib = _calibrate(result.trials, by_key, args.cluster, args.device, workdir)
    table_rows = _trial_rows(result.trials, by_key, calib)
    best = result.best
    data: dict[str, Any] = {"trials": table_rows, "seconds": result.seconds,
                            "chosen": plan_to_dict(best.plan) if best else None,
                            "calibration": calib.summary() if calib else None}
    if out:
        _write_out(out, data, table_rows, best.plan if best else None, args.force)

    def render(console_out: Any) -> None:
        console_out.print(_table(table_rows, TRIAL_COLUMNS,
                                 "tune: predicted and measured step time"))
        console_out.print(LEGEND[calib is not None])
        if any(r.get("partial_step_s") for r in table_rows):
            console_out.print(f"{PARTIAL}: a pruned trial's median step before it was stopped "
                              "(calibration leaves it out)")
        for r in table_rows:
            if r.get("reason"):
                console_out.print(f"{_cell(r, 'source')}: {r['reason']}", markup=False)
        if calib:
            from autoplan.calibrate_cli import error_line, fitted_line

            s = calib.summary()
            console_out.print(error_line(s, "the trials"))
            if s["factors_unidentified"]:
                console_out.print(fitted_line(s))
        if best:
            console_out.print(f"chosen: {_short(best.plan)}")

    emit(args, _shown(args, data), render)
    if calib:
        from autoplan.calibrate_cli import warn_overfit
        warn_overfit(calib, "tune")
    if best is None:
        raise NoFeasiblePlanError("no trial completed; see the reasons under the table")
    return 0


def _config(args: argparse.Namespace) -> Any:
    """The tune's TuneConfig (the dry run's too: it checks the study the tune would open)."""
    from autoplan.tune.study import TuneConfig

    return TuneConfig(steps=args.steps, budget_s=args.budget_s,
                      trial_timeout_s=args.trial_timeout_s, prune_ratio=args.prune_ratio,
                      storage=args.storage, study_name=args.study, request=_request(args))


def _request(args: argparse.Namespace) -> dict[str, Any]:
    """What this tune's trials answer, for its study's fingerprint (tune.study.fingerprint)."""
    from autoplan.plan_args import resolve_model
    from autoplan.search.optuna_search import model_hash

    model = resolve_model(args)
    return {"model": model.name, "model_sha256": model_hash(model), "cluster": args.cluster,
            "num_gpus": args.num_gpus, "global_batch_size": args.global_batch_size,
            "seq_len": model.seq_len}


def _candidates(args: argparse.Namespace) -> list[Any]:
    """The user's --plan files (each for this tune's model, sequence length, global batch size
    and --num-gpus ranks) and the search's best, deduplicated (tune.study.make_candidates);
    none at all is an infeasible request (exit 3)."""
    from autoplan.plan_args import resolve_model
    from autoplan.tune.study import make_candidates

    model = resolve_model(args)
    user = [(_user_plan(path, model, args), "user") for path in args.plan]
    try:
        found = search_candidates(args)
    except NoFeasiblePlanError:
        if not user:
            raise
        found = []  # the user's plans still run
    return make_candidates(user + found)


def _user_plan(path: str, model: ModelSpec, args: argparse.Namespace) -> Plan:
    """A --plan file, refused (exit 2, both values) unless it trains this tune's model, with
    its sequence length and global batch size, on --num-gpus ranks of the --cluster profile:
    trials are only comparable when every plan trains the same tokens per step, and a plan's
    prediction (which orders the trials and is calibrated against) is priced on its own
    profile."""
    from autoplan.hardware import load_profile

    data = read_yaml(path, "--plan")
    if not isinstance(data, dict):
        raise ConfigError("--plan", f"{path} is not a mapping of plan fields")
    try:
        plan = plan_from_dict(plan_file_paths(data, path))  # its paths from its folder
        spec = plan.model_spec()
    except ConfigError as err:
        raise ConfigError(f"--plan {path}: {err.field}", err.problem, err.fix) from None
    checks = (
        ("--num-gpus", "ranks", plan.world_size, args.num_gpus),
        ("--model", "model", spec.name if spec.replace(seq_len=model.seq_len) == model
         or spec.name != model.name else f"{spec.name} (another spec)", model.name),
        ("--seq-len", "seq_len", spec.seq_len, model.seq_len),
        ("--global-batch-size", "batch.global_batch_size", plan.batch.global_batch_size,
         args.global_batch_size),
        # a name and a path to the same profile are the same profile
        ("--cluster", "cluster.profile", plan.cluster.profile
         if load_profile(plan.cluster.profile) != load_profile(args.cluster) else args.cluster,
         args.cluster),
    )
    for flag, name, got, want in checks:
        if got != want:
            raise ConfigError("--plan", f"{path} has {name} {got}, but this tune has {flag} {want}",
                              f"give a plan for {flag} {want}, or tune with {flag} {got}")
    # what `autoplan train` would refuse, refused before a trial is spent on it
    from autoplan.runtime.validation import runtime_problems
    problems = runtime_problems(plan, spec)
    if problems:
        raise ConfigError("--plan", f"{path} cannot train here: {'; '.join(problems)}",
                          "fix the plan, or tune without it")
    return plan


def _dry_run(args: argparse.Namespace, candidates: list[Any]) -> int:
    """Print the trials tune would run and their predicted seconds against the budget, once
    the --study the tune would resume passes its checks (read only: nothing is created)."""
    from autoplan.tune.study import check_study, fingerprint

    cfg = _config(args)
    check_study(cfg, fingerprint(candidates, cfg))
    rows: list[dict[str, Any]] = [{"key": c.key, "source": c.source, "plan": _short(c.plan),
             "predicted_step_s": c.predicted_step_s,
             "predicted_trial_s": c.predicted_trial_s(args.steps)} for c in candidates]
    total = sum(r["predicted_trial_s"] for r in rows)
    spent, fit = 0.0, 0  # tune runs them best predicted first until the budget is spent
    for r in rows:
        spent += r["predicted_trial_s"]
        fit += spent <= args.budget_s
    dry = {"trials": rows, "predicted_total_s": total, "budget_s": args.budget_s,
           "predicted_within_budget": fit}

    def render_dry(console: Any) -> None:
        console.print(_table(rows, (("source", "source"), ("plan", "plan"),
                                    ("predicted_step_s", "step s"),
                                    ("predicted_trial_s", "trial s")),
                             "trials tune would run"))
        line = f"predicted total {total:.0f} s of a {args.budget_s:.0f} s budget"
        if total > args.budget_s:
            line += (f": about {fit} of {len(rows)} trials fit; tune runs them best predicted "
                     "first and reports the rest as not run (raise --budget-s to run all)")
        console.print(line)

    emit(args, _shown(args, dry), render_dry)
    return 0


def _shown(args: argparse.Namespace, data: dict[str, Any]) -> Any:
    """What --format prints: YAML rounded for reading (4 significant figures), as search and
    estimate print it; JSON with every digit."""
    from autoplan.cli_common import resolve_format
    from autoplan.display import rounded

    return rounded(data) if resolve_format(args) == "yaml" else data


def _trial_printer(console: Any, total: int) -> Any:
    """run_tune's per-trial callback: one line per run, on a terminal or not."""
    finished = [0]
    started = time.monotonic()

    def on_trial(cand: Any, outcome: Any) -> None:
        finished[0] += 1
        measured = f"{outcome.step_time_s:.4g} s" if outcome.step_time_s else "-"
        console.print(f"  [{finished[0]}/{total}, {time.monotonic() - started:.0f} s] "
                      f"{cand.source:14} {_short(cand.plan):48} {outcome.status:8} "
                      f"{measured} {outcome.reason}", markup=False)

    return on_trial


def _calibrate(trials: list[dict[str, Any]], by_key: dict[str, Any], cluster: str,
               device: str, workdir: Path) -> Any:
    """Calibrate the profile on the completed trials (two at least), each kept as a run record
    under workdir/runs; None with fewer."""
    from autoplan.calibrate import RunRecord, calibrate, load_run
    from autoplan.hardware import load_profile
    from autoplan.tune.study import run_record

    records = [run_record(by_key[t["key"]], t, cluster, device)
               for t in trials if t["status"] == "complete"]
    if len(records) < 2:
        return None
    paths = []
    for i, rec in enumerate(records):
        path = workdir / "runs" / f"{i:03d}.json"
        write_text_atomic(path, json_text(rec), overwrite=True)
        paths.append(path)
    runs: list[RunRecord] = [load_run(p) for p in paths]
    # calibrate's own defaults (trials, seed), as `autoplan calibrate` on these records runs
    # it: tune's 150 trials gave 0.0663 s where calibrate's 300 gave 0.0655 (user test 35)
    return calibrate(runs, load_profile(cluster), held_out=True)


def _trial_rows(trials: list[dict[str, Any]], by_key: dict[str, Any], calib: Any
                ) -> list[dict[str, Any]]:
    """One row per trial: where its plan came from, the plan, the trial's fields and, once
    calibrated, what the calibrated profile predicts for it (run or not)."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import ClusterSpec

    rows = []
    for t in trials:
        plan = by_key[t["key"]].plan
        row = {"source": by_key[t["key"]].source, "plan": _short(plan), **t}
        if calib:
            row["predicted_after_s"] = estimate_plan(
                plan, ClusterSpec(calib.profile, plan.cluster.num_gpus)).step_time_s
        rows.append(row)
    return rows


def _short(plan: Plan) -> str:
    p = plan.parallel
    return (f"dp{p.dp} tp{p.tp} pp{p.pp} z{plan.zero_stage} "
            f"{plan.recompute.policy.value} mbs{plan.batch.micro_batch_size}"
            + (" sp" if plan.sequence_parallel else "")
            + (f" {plan.pipeline.schedule.value}" if p.pp > 1 else "")
            + (f" {plan.precision.value}" if plan.precision.value != "bf16" else "")
            + (" eager" if plan.attention.value == "eager" else ""))


TRIAL_COLUMNS = (("source", "source"), ("plan", "plan"), ("status", "status"),
                 ("predicted_step_s", "pred. s"), ("predicted_after_s", "calib. s"),
                 ("measured_step_s", "meas. s"), ("measured_tokens_per_s", "tokens/s"))
"""(row key, header) of the tune's table, short enough for an 80-column terminal with the two
predictions told apart (LEGEND); each trial's reason follows the table."""
LEGEND = {False: "pred. s: the step time the profile predicts; meas. s: the median measured "
                 "step",
          True: "pred. s, calib. s: the step time predicted by the profile, and by the profile "
                "calibrated on these trials; meas. s: the median measured step"}
"""The table's legend, without and with a calibration."""
PARTIAL = "~"
"""Marks a pruned trial's partial figure in the measured columns."""
PARTIAL_OF = {"measured_step_s": "partial_step_s",
              "measured_tokens_per_s": "partial_tokens_per_s"}


def _cell(row: dict[str, Any], key: str) -> str:
    """A table cell: seconds to 3 significant figures, tokens/s whole, `-` for no figure, and
    a pruned trial's partial measurement marked with PARTIAL."""
    from autoplan.display import sig, whole

    value, mark = row.get(key), ""
    if value is None and row.get(PARTIAL_OF.get(key, "")) is not None:
        value, mark = row[PARTIAL_OF[key]], PARTIAL
    if value is None:
        return "-" if key.endswith(("_s", "_per_s")) else ""
    if key == "source":
        return str(value).removeprefix("model ")  # "rank 3" or "user"
    if isinstance(value, float):
        return mark + (whole(value) if key.endswith("_per_s") else sig(value))
    return str(value)


def _table(rows: list[dict[str, Any]], cols: tuple[tuple[str, str], ...], title: str) -> Table:
    """The rows under `cols` (those no row has a figure for left out); only the plan wraps."""
    cols = tuple((key, header) for key, header in cols
                 if any(r.get(key) is not None for r in rows))
    t = Table(title=title)
    for key, header in cols:
        t.add_column(header, justify="right" if key.endswith("_s") else "left",
                     no_wrap=key != "plan", min_width=len(header))
    for r in rows:
        t.add_row(*[_cell(r, key) for key, _ in cols])
    return t


def _write_out(out: Path, data: dict[str, Any], rows: list[dict[str, Any]], best: Plan | None,
               force: bool) -> None:
    """plan.yaml, trials.csv and summary.json, each whole, all written before any is placed
    (fsutil.atomic_dir; trials/ and runs/ beside them are the tune's own work)."""
    buf = io.StringIO()
    fields = sorted({k for r in rows for k in r})
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    with fsutil.atomic_dir(out, force=force, names=OUT_FILES) as tmp:
        if best is not None:
            fsutil.write_text(tmp / "plan.yaml", dump_yaml(plan_to_dict(best)))
        fsutil.write_text(tmp / "trials.csv", buf.getvalue())
        fsutil.write_text(tmp / "summary.json", json_text(data) + "\n")
