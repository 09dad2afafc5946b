"""`autoplan calibrate RUNS... --profile P`: fit a profile to measured runs and say how much the
prediction error shrank."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from autoplan import fsutil, resources
from autoplan.calibrate import Calibration, calibrate, check_runs, load_run, profile_file
from autoplan.cli_common import add_format_argument, check_seed, count, emit
from autoplan.errors import ConfigError
from autoplan.hardware import check_out_and_name, load_profile
from autoplan.yaml_io import save_yaml, to_dict

MAX_TRIALS = 100_000
"""Largest --trials (each trial prices every run; a TPE study's time per trial grows with the
trials before it: past this it runs for hours); a larger count is a typo."""


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a profile's efficiency factors to measured runs",
                       description="Fit compute, bandwidth, latency, dispatch and overlap "
                       "factors of a profile to run records written by `autoplan train`.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run record files (YAML or JSON)")
    p.add_argument("--profile", required=True, help="profile to start from: a name (your "
                   "profile directory, then the built-in ones) or a path")
    p.add_argument("--out", help="where to write the fitted profile (default "
                   "<profile>-calibrated.yaml in $AUTOPLAN_PROFILES or ~/.config/autoplan/"
                   "profiles, under the name given to --profile)")
    p.add_argument("--trials", type=count(high=MAX_TRIALS), default=300,
                   help="Optuna trials (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    add_format_argument(p)
    p.set_defaults(func=calibrate_command)


def default_out(profile_ref: str) -> Path:
    """`<name given>-calibrated.yaml` in the user's profile directory: never the checkout, and
    never a directory that a profile's inner `name:` or a crafted file name decides."""
    stem = profile_ref if resources.is_name(profile_ref) else Path(profile_ref).stem
    try:
        stem = resources.safe_name(stem, "--profile")
    except ConfigError as err:
        raise ConfigError(err.field, err.problem, "give --out PATH for the fitted profile") from None
    return resources.user_dir(resources.PROFILES) / f"{stem}-calibrated.yaml"


def check_out(out: Path, args: argparse.Namespace) -> None:
    """Before the fit: an --out that is a directory or an unwritable place, one that
    `--profile` could not load back (no .yaml suffix), or one of the command's inputs (--force
    or not)."""
    fsutil.check_file_target(out, force=args.force)
    if args.out is not None:
        check_out_and_name(args.out, None, "--profile")  # `autoplan profile --out`'s rule
    for run in args.runs:
        fsutil.check_not_input(out, run, "a run record being fitted")
    base = profile_file(args.profile)
    if base is not None:
        fsutil.check_not_input(out, str(base), "the profile being fitted")


def calibrate_command(args: argparse.Namespace) -> int:
    check_seed("--seed", args.seed)
    base = load_profile(args.profile, "--profile")
    runs = [load_run(r) for r in args.runs]
    out = Path(args.out) if args.out else default_out(args.profile)
    check_out(out, args)
    check_runs(runs, args.profile, base)
    result = calibrate(runs, base, trials=args.trials, seed=args.seed)
    summary = result.summary()
    prof = to_dict(result.profile)
    prof["name"] = out.stem
    prof["measured"] = {**(prof.get("measured") or {}), "calibration": {
        **summary, "base": base.name, "sources": [r.source for r in runs],
        # the peak's multiplier from the device's own, over this fit and the base's (MFU)
        "device_compute": base.calibrated_compute * summary["factors"]["compute"]}}
    written = save_yaml({"schema_version": 1, **prof}, out, overwrite=args.force)
    rows: list[dict[str, Any]] = [{"run": r.source, "measured_s": r.measured.step_time_s,
             "error_before": b, "error_after": a}
            for r, b, a in zip(runs, result.step_errors_before, result.step_errors_after,
                               strict=True)]
    data = {"profile": str(written), **summary, "per_run": rows}

    def render(console: Any) -> None:
        t = Table(title=f"step time: predicted vs measured ({len(runs)} runs)")
        for c in ("run", "measured s", "error before", "error after"):
            t.add_column(c, justify="left" if c == "run" else "right")
        for r in rows:
            t.add_row(Path(r["run"]).name, f"{r['measured_s']:.4g}", f"{r['error_before']:+.1%}",
                      f"{r['error_after']:+.1%}")
        console.print(t)
        console.print(f"mean absolute error {summary['step_time_mape_before']:.1%} -> "
                      f"{summary['step_time_mape_after']:.1%} (on the runs it was fitted to)")
        for name, why in summary["factors_left"].items():
            console.print(f"left {name} unchanged: {why}")
        if summary["memory_mape_before"] is not None:
            console.print(f"peak memory error {summary['memory_mape_before']:.1%} -> "
                          f"{summary['memory_mape_after']:.1%}")
        console.print(f"wrote {written}")

    emit(args, data, render)
    warn_overfit(result)
    return 0


def warn_overfit(result: Calibration, command: str = "calibrate") -> None:
    """Say on stderr when the fit's after-error cannot be trusted beyond its runs: more
    factors than different plans, or factors the search pressed against a bound."""
    fitted, plans = result.fitted, result.distinct_plans
    if len(fitted) > plans:
        sys.stderr.write(
            f"autoplan {command}: warning: {len(fitted)} factors fitted to "
            f"{plans} different plan{'s' if plans != 1 else ''}: the error after is measured on "
            "the runs it was fitted to and says little of other plans; fit runs of more plans "
            "(different tp, pp, dp, micro-batch) before trusting it\n")
    if result.at_bound:
        sys.stderr.write(f"autoplan {command}: warning: {', '.join(result.at_bound)} ended on "
                         "the bound of its range: the runs ask for more than the factor allows, "
                         "a sign that something it does not model is at work\n")
