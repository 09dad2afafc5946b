"""`autoplan tune`: run the cost model's best candidates for a few steps and keep the fastest."""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

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
from autoplan.plan import Plan
from autoplan.plan_args import SEQ_LEN, SEQ_LEN_HELP
from autoplan.plan_files import plan_to_dict
from autoplan.tune.candidates import tune_candidates
from autoplan.tune.table import (
    LEGEND,
    PARTIAL,
    TRIAL_COLUMNS,
    cell,
    dry_run_line,
    resumed_line,
    short_plan,
    trial_printer,
    trial_rows,
    trial_table,
)
from autoplan.yaml_io import dump_yaml, show, write_text_atomic

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
            candidates = tune_candidates(args)
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
    result = run_tune(candidates, cfg, workdir, trial_printer(console, len(candidates)))
    by_key = {c.key: c for c in candidates}
    calib = _calibrate(result.trials, by_key, args.cluster, args.device, workdir)
    table_rows = trial_rows(result.trials, by_key, calib)
    best = result.best
    data: dict[str, Any] = {"trials": table_rows, "seconds": result.seconds,
                            "chosen": plan_to_dict(best.plan) if best else None,
                            "calibration": calib.summary() if calib else None}
    if args.study:  # search's summary field, with the counts its resumed line gives
        data["studies"] = [{"study": args.study, "stored": result.stored, "new": result.new}]
    if out:
        _write_out(out, data, table_rows, best.plan if best else None, args.force)

    def render(console_out: Any) -> None:
        if result.stored:
            console_out.print(resumed_line(args.study, result.stored, result.new,
                                           len(candidates)), markup=False, soft_wrap=True)
        console_out.print(trial_table(table_rows, TRIAL_COLUMNS,
                                 "tune: predicted and measured step time"))
        console_out.print(LEGEND[calib is not None])
        if any(r.get("partial_step_s") for r in table_rows):
            console_out.print(f"{PARTIAL}: a pruned trial's median step before it was stopped "
                              "(calibration leaves it out)")
        for r in table_rows:
            if r.get("reason"):
                console_out.print(f"{cell(r, 'source')}: {r['reason']}", markup=False)
        if calib:
            from autoplan.calibrate_cli import error_line, fitted_line

            s = calib.summary()
            console_out.print(error_line(s, "the trials"))
            if s["factors_unidentified"]:
                console_out.print(fitted_line(s))
        if best:
            console_out.print(f"chosen: {short_plan(best.plan)}")

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


def _dry_run(args: argparse.Namespace, candidates: list[Any]) -> int:
    """Print the trials tune would run and their predicted seconds against the budget, once
    the --study the tune would resume passes its checks (read only: nothing is created); the
    trials that study holds a result for are shown with it, at 0 s: the tune runs them not
    again."""
    from autoplan.tune.study import check_study

    stored = check_study(_config(args), candidates)
    rows: list[dict[str, Any]] = []
    for c in candidates:
        row = {"key": c.key, "source": c.source, "plan": short_plan(c.plan), "status": "to run",
               "predicted_step_s": c.predicted_step_s,
               "predicted_trial_s": c.predicted_trial_s(args.steps)}
        if c.key in stored:
            done = stored[c.key]
            row.update({k: done[k] for k in ("status", "reason", "measured_step_s",
                                             "measured_tokens_per_s", "partial_step_s",
                                             "partial_tokens_per_s")},
                       predicted_trial_s=0.0)
        rows.append(row)
    to_run = [r for r in rows if r["key"] not in stored]
    total = sum(r["predicted_trial_s"] for r in to_run)
    spent, fit = 0.0, 0  # tune runs them best predicted first until the budget is spent
    for r in to_run:
        spent += r["predicted_trial_s"]
        fit += spent <= args.budget_s
    dry = {"trials": rows, "predicted_total_s": total, "budget_s": args.budget_s,
           "predicted_within_budget": fit, "stored": len(stored)}
    cols = (("source", "source"), ("plan", "plan"), *((("status", "status"),) if stored else ()),
            ("predicted_step_s", "step s"), ("measured_step_s", "meas. s"),
            ("predicted_trial_s", "trial s"))
    title = (f"trials of study {args.study}: {len(stored)} stored (not run again), "
             f"{len(to_run)} to run" if stored else "trials tune would run")

    def render_dry(console: Any) -> None:
        console.print(trial_table(rows, cols, title))
        for r in rows:  # a stored trial's (pruned, failed), as the tune prints them
            if r.get("reason"):
                console.print(f"{cell(r, 'source')}: {r['reason']}", markup=False)
        console.print(dry_run_line(total, args.budget_s, fit, len(to_run), len(stored),
                                   args.study), soft_wrap=True)

    emit(args, _shown(args, dry), render_dry)
    return 0


def _shown(args: argparse.Namespace, data: dict[str, Any]) -> Any:
    """What --format prints: YAML rounded for reading (4 significant figures), as search and
    estimate print it; JSON with every digit."""
    from autoplan.cli_common import resolve_format
    from autoplan.display import rounded

    return rounded(data) if resolve_format(args) == "yaml" else data


def _calibrate(trials: list[dict[str, Any]], by_key: dict[str, Any], cluster: str,
               device: str, workdir: Path) -> Any:
    """Calibrate the profile on the completed trials (two at least), each kept as a run record
    under workdir/runs; None with fewer."""
    from autoplan.calibrate import RunRecord, calibrate, load_run
    from autoplan.hardware import load_profile
    from autoplan.tune.study import run_record

    done = [t for t in trials if t["status"] == "complete"]
    if len(done) < 2:
        return None
    paths = []
    for i, t in enumerate(done):
        path = workdir / "runs" / f"{i:03d}.json"
        write_text_atomic(path, json_text(run_record(by_key[t["key"]], t, cluster, device)),
                          overwrite=True)
        paths.append(path)
    runs: list[RunRecord] = [load_run(p) for p in paths]
    _warn_busy(runs, [by_key[t["key"]] for t in done])
    # calibrate's own defaults (trials, seed), as `autoplan calibrate` on these records runs
    # it: tune's 150 trials gave 0.0663 s where calibrate's 300 gave 0.0655 (user test 35)
    return calibrate(runs, load_profile(cluster), held_out=True)


def _warn_busy(runs: list[Any], cands: list[Any]) -> None:
    """`autoplan calibrate`'s warning (calibrate_runs.busy_host) for each trial run on a host
    other processes kept busy, before the fit, naming the trial rather than its record (which
    a tune without --out removes)."""
    import dataclasses

    from autoplan.calibrate_runs import busy_host

    for run, cand in zip(runs, cands, strict=True):
        named = dataclasses.replace(run, source=f"the trial of {cand.source} "
                                                f"({short_plan(cand.plan)})")
        if line := busy_host(named):
            sys.stderr.write(f"autoplan tune: warning: {line}\n")


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
