"""`autoplan calibrate RUNS... --profile P`: fit a profile to measured runs and say how much the
prediction error shrank."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from autoplan import fsutil, resources
from autoplan.calibrate import (
    FAR,
    MIN_HELD_OUT_PLANS,
    Calibration,
    calibrate,
    check_runs,
    load_run,
    profile_file,
)
from autoplan.calibrate_runs import busy_host
from autoplan.cli_common import add_format_argument, check_seed, count, emit
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.profile_files import check_out_and_name
from autoplan.yaml_io import save_yaml, to_dict

MAX_TRIALS = 100_000
"""Largest --trials (each trial prices every run; a TPE study's time per trial grows with the
trials before it: past this it runs for hours); a larger count is a typo."""


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a profile's efficiency factors to measured runs",
                       description="Fit compute, bandwidth, latency, dispatch and overlap "
                       "factors of a profile to run records written by `autoplan train`: no "
                       "more factors than the runs have different plans, and with three or "
                       "more, each plan also predicted by a fit to the others (held out).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run record files (YAML or JSON)")
    p.add_argument("--profile", required=True, help="profile to start from: a name (your "
                   "profile directory, then the built-in ones) or a path")
    p.add_argument("--out", help="where to write the fitted profile (default "
                   "<profile>-calibrated.yaml in $AUTOPLAN_PROFILES or ~/.config/autoplan/"
                   "profiles, under the name given to --profile)")
    p.add_argument("--trials", type=count(high=MAX_TRIALS), default=300,
                   help="Optuna trials (default 300)")
    p.add_argument("--seed", type=count(None, None, example="0"), default=0,
                   help="sampler seed (default 0)")
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
        raise ConfigError(err.field, err.problem,
                          "give --out PATH for the fitted profile") from None
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
    busy = {r.source: line for r in runs if (line := busy_host(r))}
    for line in busy.values():  # before the fit, which may take a while
        sys.stderr.write(f"autoplan calibrate: warning: {line}\n")
    result = calibrate(runs, base, trials=args.trials, seed=args.seed, held_out=True)
    summary = result.summary()
    prof = to_dict(result.profile)
    prof["name"] = out.stem
    prof["description"] = calibrated_description(base.description, args.profile, summary)
    prof["measured"] = {**(prof.get("measured") or {}), "calibration": {
        **summary, "base": base.name, "sources": [r.source for r in runs],
        # the peak's multiplier from the device's own, over this fit and the base's (MFU)
        "device_compute": base.calibrated_compute * summary["factors"]["compute"]}}
    written = save_yaml({"schema_version": 1, **prof}, out, overwrite=args.force)
    held = result.step_errors_held_out
    held_out: list[float | None] = list(held) if held else [None] * len(runs)
    rows: list[dict[str, Any]] = [{"run": r.source, "measured_s": r.measured.step_time_s,
             "error_before": b, "error_after": a, "error_held_out": h,
             "busy_host": busy.get(r.source)}
            for r, b, a, h in zip(runs, result.step_errors_before, result.step_errors_after,
                                  held_out, strict=True)]
    data = {"profile": str(written), **summary, "per_run": rows}

    def render(console: Any) -> None:
        t = Table(title=f"step time: predicted vs measured ({len(runs)} "
                      f"run{'' if len(runs) == 1 else 's'})")
        cols = ("run", "measured s", "error before", "error after") + (
            ("held out",) if held else ())
        for c in cols:
            t.add_column(c, justify="left" if c == "run" else "right")
        for r in rows:
            t.add_row(Path(r["run"]).name, f"{r['measured_s']:.4g}", f"{r['error_before']:+.1%}",
                      f"{r['error_after']:+.1%}",
                      *((f"{r['error_held_out']:+.1%}",) if held else ()))
        console.print(t)
        if summary["values"]:
            console.print(values_table(summary["values"]))
        console.print(ERROR_LEGEND)
        console.print(error_line(summary, "the runs"))
        if summary["factors_unidentified"]:
            console.print(fitted_line(summary))
        for name, why in summary["factors_left"].items():
            if name not in summary["factors_unidentified"]:
                console.print(f"left {name} unchanged: {why}")
        if summary["memory_mape_before"] is not None:
            console.print(f"peak memory error {summary['memory_mape_before']:.1%} -> "
                          f"{summary['memory_mape_after']:.1%}")
        console.print(f"wrote {written}")

    emit(args, data, render)
    warn_overfit(result)
    return 0


def values_table(values: dict[str, dict[str, Any]]) -> Table:
    """Each fitted field, before -> after, and the ratio (calibrate_factors.fitted_values)."""
    t = Table(title="fitted values (the profile written)")
    for c in ("factor", "field", "before", "after", "after / before"):
        t.add_column(c, justify="left" if c in ("factor", "field") else "right")
    for name, v in values.items():
        r = v["ratio"]
        t.add_row(name, v["field"], f"{v['before']:.4g}", f"{v['after']:.4g}",
                  "from 0" if r is None else f"x{r:.3g}")
    return t


def far_line(summary: dict[str, Any]) -> str:
    """The fields the fit moved by more than FAR either way: what it says of them."""
    values = summary["values"]
    moved = ", ".join(f"{values[n]['field']} {values[n]['before']:.3g} -> "
                      f"{values[n]['after']:.3g} (x{values[n]['ratio']:.3g})"
                      for n in summary["factors_moved_far"])
    one = len(summary["factors_moved_far"]) == 1
    return (f"the fit moved {moved}, more than {FAR:g}x: the runs may not constrain "
            f"{'it' if one else 'them'} (the fit may have moved {'it' if one else 'them'} to "
            "absorb what it does not price); check against the measured value before trusting "
            "plans priced with the fitted profile")


def calibrated_description(before: str, base_ref: str, summary: dict[str, Any]) -> str:
    """The base profile's description and what this fit changed, replacing an earlier fit's
    sentence (the record under measured.calibration keeps the details)."""
    own = before.split(CALIBRATED)[0].strip()
    moved = ", ".join(f"{name} x{v['ratio']:.3g}" if v["ratio"] is not None
                      else f"{name} from 0" for name, v in summary["values"].items())
    plans = summary["distinct_plans"]
    fit = (f"{CALIBRATED} from {base_ref} to {summary['runs']} run(s) of {plans} plan"
           f"{'' if plans == 1 else 's'}: {moved or 'nothing moved'} (measured.calibration).")
    return f"{own} {fit}" if own else fit


CALIBRATED = "Calibrated by `autoplan calibrate`"
"""How a calibrated profile's description starts its fit's sentence."""


ERROR_LEGEND = ("errors are predicted / measured - 1: -20% is a step predicted 20% shorter than "
                "it ran (`train` shows that miss as measured / predicted 1.25x, 25% slower)")
"""What the sign of calibrate's errors means: the fit's residual (calibrate_pricing.step_errors),
against `train`'s measured / predicted ratio for the same miss."""


def error_line(summary: dict[str, Any], runs: str) -> str:
    """The step-time error before and after the fit: on `runs` it was fitted to, and held out
    (each plan predicted by a fit to the others) where the plans allow it."""
    line = (f"mean absolute error {summary['step_time_mape_before']:.1%} -> "
            f"{summary['step_time_mape_after']:.1%} on {runs} it was fitted to")
    if summary["step_time_mape_held_out"] is None:
        return (f"{line} (held out: needs {MIN_HELD_OUT_PLANS} different plans, these are "
                f"{summary['distinct_plans']})")
    return (f"{line}, {summary['step_time_mape_held_out']:.1%} on each plan left out of the "
            "fit (leave-one-plan-out)")


def fitted_line(summary: dict[str, Any]) -> str:
    """Which factors the fit set when the runs feel more than their plans can identify, and the
    share of the predicted step time each governs: the multipliers' shares split it (they add
    up to 100% at most); overlap's, the communication it could hide, lies inside theirs and is
    said apart (calibrate_identify.factor_shares)."""
    plans, shares = summary["distinct_plans"], summary["factor_shares"]

    def named(names: list[str]) -> str:
        return ", ".join(f"{name} (could hide {shares[name]:.0%})" if name == "overlap"
                         else f"{name} ({shares[name]:.0%})"
                         for name in sorted(names, key=lambda n: (n == "overlap", -shares[n])))

    many = plans != 1
    split = sum(share for name, share in shares.items() if name != "overlap")
    legend = (f"; a factor's % is its share of the predicted step time (the shares add up to "
              f"{split:.0%})")
    if "overlap" in shares:
        legend += ", overlap's the part of the communication's share it could hide"
    return (f"{plans} different plan{'s' if many else ''} identif{'y' if many else 'ies'} "
            f"{plans} factor{'s' if many else ''}: fitted the {plans if many else 'one'} that "
            f"govern{'' if many else 's'} most of the predicted step time, "
            f"{named(summary['factors_fitted'])}; left "
            f"{named(summary['factors_unidentified'])} for runs of more plans (other tp, pp, "
            f"dp, micro-batch){legend}")


def warn_overfit(result: Calibration, command: str = "calibrate") -> None:
    """Say on stderr what the fit's after-error cannot show: that no plan was held out, that
    the held-out error is above the error before the fit, or that factors ended on a bound."""
    s = result.summary()
    held, before = s["step_time_mape_held_out"], s["step_time_mape_before"]
    if held is None:
        sys.stderr.write(
            f"autoplan {command}: warning: the error after is measured on the runs it was "
            f"fitted to alone, and says little of other plans: with {MIN_HELD_OUT_PLANS} or "
            "more different plans each is also predicted by a fit to the others\n")
    elif held > before:
        sys.stderr.write(
            f"autoplan {command}: warning: the held-out error ({held:.1%}) is above the error "
            f"before the fit ({before:.1%}): the fit does not carry to plans it has not seen; "
            "keep the profile you started from, or fit runs of more plans\n")
    if s["factors_moved_far"]:
        sys.stderr.write(f"autoplan {command}: warning: {far_line(s)}\n")
    if result.at_bound:
        sys.stderr.write(f"autoplan {command}: warning: {', '.join(result.at_bound)} ended on "
                         "the bound of its range: the runs ask for more than the factor allows, "
                         "a sign that something it does not model is at work\n")
