"""Closed loop on this machine: profile it, predict a set of plans, run each, compare.

1. `autoplan profile --quick` measures this machine into a temporary profile (or --profile P).
2. At least 12 plans of a small model on 1-8 gloo ranks (dp/tp/pp/ZeRO/recompute/micro-batch
   variety) are scored by the cost model with that profile.
3. Each plan runs for --steps steps with `autoplan train --metrics-file` in its own process.
4. Prints predicted against measured step time and peak memory per plan, and the summary:
   Spearman rank correlation, median absolute step-time error, median peak-memory error, and
   how far the model's first choice is from the measured best.

Run: python benchmarks/closed_loop.py [--profile P] [--steps 8] [--model tiny] [--out DIR]
`--precisions fp32,bf16` (the default) runs every plan in each: bf16 plans run FSDP2 with bf16
compute copies (runtime/data_parallel.py) and their attention core in fp32 (autoplan-cpu's
attention_compute_dtype: torch's bf16 CPU flash backward is the bottleneck), priced from the
profile's bf16 GEMM figures and fp32 attention figures plus the casts (profiler/precision.py);
the statistics cover both together, then each precision, then the bf16/fp32 step-time ratio of
the same plan, measured and predicted.
`--calibrate` fits the profile to these runs (autoplan calibrate) and reprints, in sample and
held out (k-fold: each plan predicted by a profile fitted to the other folds' runs).
`--reuse` takes the measurements already in --out instead of running the plans again (for
re-predicting after a cost-model change).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from autoplan.calibrate import calibrate, load_run
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import Plan, plan_from_dict
from autoplan.plan_files import plan_to_dict
from autoplan.tune.runner import TrialOutcome, run_trial
from autoplan.yaml_io import dump_yaml

PLANS: list[dict] = [  # (world size from the degrees)
    {"parallel": {"dp": 1}},
    {"parallel": {"dp": 1}, "batch": {"micro_batch_size": 2, "global_batch_size": 16}},
    {"parallel": {"dp": 2}},
    {"parallel": {"dp": 4}},
    {"parallel": {"dp": 8}, "batch": {"micro_batch_size": 2, "global_batch_size": 16}},
    {"parallel": {"dp": 2}, "zero_stage": 3},
    {"parallel": {"dp": 4}, "zero_stage": 2},
    {"parallel": {"tp": 2}},
    {"parallel": {"tp": 2}, "sequence_parallel": True},
    {"parallel": {"tp": 4}, "sequence_parallel": True},
    {"parallel": {"pp": 2}, "pipeline": {"schedule": "1f1b"}},
    {"parallel": {"pp": 2}, "pipeline": {"schedule": "gpipe"}},
    {"parallel": {"dp": 2, "tp": 2}},
    {"parallel": {"dp": 2, "pp": 2}},
    {"parallel": {"dp": 2}, "recompute": {"policy": "full"}},
    {"parallel": {"dp": 2}, "recompute": {"policy": "selective"}},
    {"parallel": {"cp": 2}},
    {"parallel": {"dp": 2, "cp": 2}, "zero_stage": 3},
]
FOLDS = 4


def make_plan(extra: dict, model: str, profile: str, precision: str = "fp32") -> Plan:
    par = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, **extra["parallel"]}
    world = par["dp"] * par["tp"] * par["pp"] * par["cp"]
    data = {"model": model, "cluster": {"profile": profile, "num_gpus": world},
            "precision": precision, "zero_stage": 1 if par["dp"] * par["cp"] > 1 else 0,
            "batch": {"micro_batch_size": 4, "global_batch_size": 16}, **extra}
    return plan_from_dict(data)


def cases(precisions: list[str]) -> list[tuple[dict, str, str]]:
    """(plan extras, precision, folder name) of every run; fp32 keeps the plainer names."""
    return [(extra, prec, f"plan{i:02d}" + ("" if prec == "fp32" else f"-{prec}"))
            for prec in precisions for i, extra in enumerate(PLANS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="profile to predict with (default: measure one now)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, help="keep plans, metrics and run records here")
    ap.add_argument("--calibrate", action="store_true", help="also fit the profile and reprint")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the measured runs in --out instead of running the plans")
    ap.add_argument("--precisions", default="fp32,bf16",
                    help="comma-separated precisions to run every plan in (fp32, bf16)")
    args = ap.parse_args()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions):
        print(f"closed_loop: --precisions {args.precisions!r}: expected fp32 and/or bf16",
              file=sys.stderr)
        return 2
    runs_list = cases(precisions)
    work = args.out or Path(tempfile.mkdtemp(prefix="autoplan-closed-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    profile_ref = args.profile
    if profile_ref is None:
        profile_ref = str(work / "cpu-measured.yaml")
        subprocess.run([sys.executable, "-m", "autoplan.commands", "profile", "--quick",
                        "--ranks", "8", "--out", profile_ref, "--force", "--format", "json"],
                       check=True, stdout=subprocess.DEVNULL)
    profile = load_profile(profile_ref)
    rows = []
    for i, (extra, prec, folder) in enumerate(runs_list):
        plan = make_plan(extra, args.model, profile_ref, prec)
        est = estimate_plan(plan, ClusterSpec(profile, plan.world_size))
        tdir = work / folder
        tdir.mkdir(exist_ok=True)
        (tdir / "plan.yaml").write_text(dump_yaml(plan_to_dict(plan)))
        out = reused(tdir, plan) if args.reuse else None
        if out is None:
            out = run_trial(tdir / "plan.yaml", plan.world_size, args.steps, tdir, timeout_s=600)
        label = " ".join(f"{k}{v}" for k, v in extra["parallel"].items())
        label += "".join(f" {k}={v}" for k, v in extra.items() if k != "parallel")
        rows.append({"plan": label[:60], "precision": prec, "ranks": plan.world_size,
                     "predicted_s": est.step_time_s, "measured_s": out.step_time_s,
                     "predicted_mem_mib": est.memory_total_bytes / 2**20,
                     "measured_mem_mib": (out.peak_memory_bytes or float("nan")) / 2**20,
                     "status": out.status, "reason": out.reason})
        rec = {"schema_version": 1, "plan": plan_to_dict(plan), "profile": profile_ref,
               "measured": {"step_time_s": out.step_time_s,
                            "peak_memory_bytes": out.peak_memory_bytes}}
        if out.status == "complete":
            (tdir / "run.json").write_text(json.dumps(rec))
        print(f"[{i + 1}/{len(runs_list)}] {label[:44]:44} {prec} {out.status}",
              file=sys.stderr)
    report(pd.DataFrame(rows))
    if args.calibrate:
        runs = sorted(str(work / c[2] / "run.json") for c in runs_list
                      if (work / c[2] / "run.json").is_file())
        fitted = work / "cpu-calibrated.yaml"
        subprocess.run([sys.executable, "-m", "autoplan.commands", "calibrate", *runs,
                        "--profile", profile_ref, "--out", str(fitted), "--force",
                        "--format", "json"], check=True, stdout=subprocess.DEVNULL)
        prof2 = load_profile(fitted)
        df = pd.DataFrame(rows)
        df["predicted_s"] = [estimate_plan(make_plan(e, args.model, profile_ref, p),
                                           ClusterSpec(prof2, r)).step_time_s
                             for (e, p, _), r in zip(runs_list, df["ranks"], strict=True)]
        print("\nafter calibration (in-sample):")
        report(df)
        print(f"\nafter calibration, held out ({FOLDS}-fold):")
        report(held_out(rows, runs_list, args.model, profile_ref, profile, work))
    print(f"\nfiles in {work}")
    return 0


def reused(tdir: Path, plan: Plan) -> TrialOutcome | None:
    """A completed run's measurements from an earlier invocation of the same plan, if any."""
    path = tdir / "run.json"
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    want = json.loads(json.dumps(plan_to_dict(plan)))
    rec["plan"]["cluster"]["profile"] = want["cluster"]["profile"]  # predicts, not measured
    if rec["plan"] != want:
        return None  # another model or an edited PLANS list: run it again
    m = rec["measured"]
    return TrialOutcome(status="complete", step_times_s=[m["step_time_s"]],
                        peak_memory_bytes=m["peak_memory_bytes"])


def held_out(rows: list[dict], runs_list: list[tuple[dict, str, str]], model: str,
             profile_ref: str, profile, work: Path) -> pd.DataFrame:
    """Each plan predicted by a profile calibrated on the runs of the other folds only."""
    df = pd.DataFrame(rows)
    runs = {i: load_run(work / c[2] / "run.json") for i, c in enumerate(runs_list)
            if (work / c[2] / "run.json").is_file()}
    for fold in range(FOLDS):
        train = [r for i, r in runs.items() if i % FOLDS != fold]
        fitted = calibrate(train, profile, trials=200, seed=fold).profile
        for i in range(fold, len(runs_list), FOLDS):
            extra, prec, _ = runs_list[i]
            plan = make_plan(extra, model, profile_ref, prec)
            df.loc[i, "predicted_s"] = estimate_plan(
                plan, ClusterSpec(fitted, plan.world_size)).step_time_s
    return df


def report(df: pd.DataFrame) -> None:
    ok = df[df["status"] == "complete"].copy()
    ok["err"] = ok["predicted_s"] / ok["measured_s"] - 1
    ok["mem_err"] = ok["predicted_mem_mib"] / ok["measured_mem_mib"] - 1
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["reason"]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if len(ok) < 3:
        print("too few completed runs for statistics")
        return
    spearman = ok["predicted_s"].rank().corr(ok["measured_s"].rank())
    best_measured = ok["measured_s"].min()
    model_first = ok.loc[ok["predicted_s"].idxmin(), "measured_s"]
    print(f"\nruns completed: {len(ok)} of {len(df)}")
    print(f"Spearman rank correlation (step time): {spearman:.3f}")
    for prec, part in ok.groupby("precision"):
        if ok["precision"].nunique() > 1 and len(part) >= 3:
            rho = part["predicted_s"].rank().corr(part["measured_s"].rank())
            err = statistics.median((part["predicted_s"] / part["measured_s"] - 1).abs())
            print(f"  {prec}: Spearman {rho:.3f}, median absolute step-time error {err:.1%}"
                  f" ({len(part)} runs)")
    print(f"median absolute step-time error: {statistics.median(ok['err'].abs()):.1%}")
    ratio = bf16_over_fp32(ok)
    if ratio is not None:
        print(f"bf16 / fp32 step time of the same plan: measured {ratio[0]:.2f}, predicted "
              f"{ratio[1]:.2f} (medians over {ratio[2]} plans)")
    mem = ok["mem_err"].dropna()
    if len(mem):
        print(f"median absolute peak-memory error: {statistics.median(mem.abs()):.1%}")
    print(f"model's first choice vs measured best: {model_first / best_measured - 1:+.1%}")


def bf16_over_fp32(ok: pd.DataFrame) -> tuple[float, float, int] | None:
    """Median bf16 / fp32 step-time ratio over the plans that completed in both, measured and
    predicted: whether bf16 is priced as much slower or faster than fp32 as it ran."""
    wide = ok.pivot_table(index="plan", columns="precision",
                          values=["measured_s", "predicted_s"], aggfunc="first")
    if ("measured_s", "bf16") not in wide.columns or ("measured_s", "fp32") not in wide.columns:
        return None
    wide = wide.dropna()
    if wide.empty:
        return None
    measured = (wide["measured_s", "bf16"] / wide["measured_s", "fp32"]).median()
    predicted = (wide["predicted_s", "bf16"] / wide["predicted_s", "fp32"]).median()
    return float(measured), float(predicted), len(wide)


if __name__ == "__main__":
    sys.exit(main())
