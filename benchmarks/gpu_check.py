"""One command for one CUDA GPU: profile it, train a ~1B Llama for a few plans, compare.

1. `autoplan profile --quick` writes the measured profile to profiles/<datasheet>-measured.yaml
   (a free name: -2, -3, ... when one exists; nothing is overwritten).
2. Llama 3.2 1B (benchmarks/data/llama-3.2-1b.yaml) trains with `autoplan train` for each plan
   of PLANS on one GPU: bf16, recompute none / selective / full, micro-batch 1 / 2 / 4,
   optimizer offload (ZeRO-Offload) on, and fp8 through torchao's float8 layers where the GPU
   and torchao allow it (skipped with the runtime's own reason where they do not).
3. Per plan: step time, peak memory and MFU predicted with the datasheet profile and with the
   fresh measured one, against the measurement; the median errors last. All of it goes to
   $OUT/gpu_check.json (or --json) after every plan, and the measured profile is copied to $OUT.

Run: python benchmarks/gpu_check.py             (the GPU machine; see benchmarks/gpu_check.sh)
     python benchmarks/gpu_check.py --dry-run   (the same flow on CPU: a tiny tied Llama)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a source tree without installing autoplan

from autoplan.errors import AutoplanError, ConfigError  # noqa: E402

MODEL_1B = ROOT / "benchmarks" / "data" / "llama-3.2-1b.yaml"
MODEL_DRY = ROOT / "benchmarks" / "data" / "tiny-llama-tied.yaml"  # the 1B's family, tied too
PLANS: tuple[dict[str, Any], ...] = (  # most informative first: a late one may be cut by time
    {"recompute": "none", "mbs": 2},
    {"recompute": "selective", "mbs": 2},
    {"recompute": "full", "mbs": 2},
    {"recompute": "none", "mbs": 2, "precision": "fp8"},
    {"recompute": "none", "mbs": 1},
    {"recompute": "none", "mbs": 4},
    {"recompute": "full", "mbs": 4},
    {"recompute": "none", "mbs": 2, "offload": True},
)
DRY_RUN_PLANS = (4, 1, 6, 7, 3)
"""--dry-run's subset: each recompute policy, each micro-batch size, offload once, and the fp8
plan, which a CPU skips with the runtime's reason."""
MIN_PLAN_S = 45.0
"""A plan is not started with less of the budget left: start-up and init alone take ~30 s."""


def label(knobs: dict[str, Any]) -> str:
    return (f"{knobs['recompute']} mbs{knobs['mbs']}" + (" offload" if knobs.get("offload") else "")
            + (f" {knobs['precision']}" if knobs.get("precision") else ""))


def plan_data(model: str, profile: str, knobs: dict[str, Any], gbs: int, precision: str
              ) -> dict[str, Any]:
    """A one-GPU plan in `precision` unless the knobs name their own. Optimizer offload needs
    ZeRO >= 1 (plan_rules); ZeRO-Offload is stage 2 (Ren et al. 2021)."""
    offload = bool(knobs.get("offload"))
    return {"schema_version": 1, "model": model,
            "cluster": {"profile": profile, "num_gpus": 1},
            "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1},
            "zero_stage": 2 if offload else 0,
            "offload": {"optimizer": offload, "params": False},
            "recompute": {"policy": knobs["recompute"]},
            "batch": {"micro_batch_size": knobs["mbs"], "global_batch_size": gbs},
            "precision": knobs.get("precision", precision), "attention": "flash"}


# -- pure helpers (tests/unit/test_gpu_check.py) -----------------------------------------------
def fresh_profile_path(directory: Path, name: str) -> tuple[str, Path]:
    """(name, directory/name.yaml), or name-2, name-3, ... when that file exists."""
    candidate, n = name, 1
    while (directory / f"{candidate}.yaml").exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate, directory / f"{candidate}.yaml"


def steady_median(step_times_s: list[float], warmup: int) -> float | None:
    """Median step time after the first `warmup` steps (all steps if that leaves none)."""
    steady = step_times_s[warmup:] or step_times_s
    return statistics.median(steady) if steady else None


def comparable_memory(memory: dict[str, float], device_type: str) -> float:
    """The predicted bytes the runtime's peak-memory figure (runtime/metrics.py) can see. On
    CUDA that is torch.cuda.max_memory_allocated: the total less the CUDA context and
    workspaces (`reserved`) and the caching allocator's fragmentation (`allocator`), which lie
    outside the allocations it counts. On CPU it is the process's peak RSS: all of it."""
    if device_type != "cuda":
        return memory["total"]
    return memory["total"] - memory.get("reserved", 0.0) - memory.get("allocator", 0.0)


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return predicted / measured - 1.0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |predicted/measured - 1| of step time and peak allocated memory per profile, over
    the plans that completed and were predicted; the measured MFU's median."""
    done = [r for r in rows if r["status"] == "complete"]
    out: dict[str, Any] = {"completed": len(done), "plans": len(rows)}
    for prof in ("datasheet", "measured_profile"):
        time_err = [abs(e) for r in done if (e := r["errors"][prof]["step_time"]) is not None]
        mem_err = [abs(e) for r in done if (e := r["errors"][prof]["memory"]) is not None]
        out[prof] = {
            "n": len(time_err),
            "step_time_median_abs_error": statistics.median(time_err) if time_err else None,
            "memory_median_abs_error": statistics.median(mem_err) if mem_err else None,
        }
    mfus = [r["mfu"]["measured"] for r in done if r["mfu"]["measured"] is not None]
    out["measured_mfu_median"] = statistics.median(mfus) if mfus else None
    return out


def compare(measured_s: float | None, measured_bytes: float | None, flops: float | None,
            peak: float, predicted: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Errors and MFU (model FLOPs per step / (seconds x datasheet peak), PaLM's definition,
    Chowdhery et al. 2022 app. B) of the measurement and of each profile's prediction."""
    errors, mfu = {}, {"measured": flops / (measured_s * peak) if flops and measured_s else None}
    for prof, est in predicted.items():
        t = est["step_time_s"] if est else None
        errors[prof] = {"step_time": relative_error(t, measured_s),
                        "memory": relative_error(est["memory_allocated_bytes"] if est else None,
                                                 measured_bytes)}
        mfu[prof] = flops / (t * peak) if flops and t else None
    return {"errors": errors, "mfu": mfu}


# -- the flow ----------------------------------------------------------------------------------
def predict(plan: Any, profile_ref: str | None, device_type: str) -> dict[str, Any] | None:
    """The cost model's estimate of `plan` on one GPU of `profile_ref`; None without a profile.
    A cost-model failure is recorded, not raised: the measurements still count."""
    if profile_ref is None:
        return None
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import ClusterSpec, load_profile

    try:
        est = estimate_plan(plan, ClusterSpec(load_profile(profile_ref), 1))
    except Exception as err:  # noqa: BLE001 - any cost-model bug: report it beside the runs
        return {"error": f"{type(err).__name__}: {err}", "step_time_s": None,
                "memory_allocated_bytes": None, "model_flops_per_step": None}
    return {"step_time_s": est.step_time_s, "memory_total_bytes": est.memory_total_bytes,
            "memory_allocated_bytes": comparable_memory(est.memory, device_type),
            "memory": est.memory, "time": est.time, "feasible": est.feasible,
            "reasons": list(est.reasons), "model_flops_per_step": est.model_flops_per_step}


def runtime_problem(plan: Any) -> str | None:
    """Why `autoplan train` would refuse `plan` on this machine before starting (the runtime's
    fp8 rule: a GPU with fp8 tensor cores and torchao), or None."""
    from autoplan.runtime.float8 import fp8_problem

    return fp8_problem(plan)


def run_profile(args: argparse.Namespace, out: Path, name: str, timeout_s: float
                ) -> tuple[dict[str, Any] | None, str]:
    """`autoplan profile --quick` through the CLI; (its JSON summary, '') or (None, why)."""
    cmd = [sys.executable, "-m", "autoplan.commands", "profile", "--quick", "--device",
           args.device, "--ranks", "1", "--name", name, "--out", str(out), "--format", "json"]
    print(f"profile: {' '.join(cmd[1:])}", flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              cwd=ROOT, env=os.environ)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    if done.returncode != 0 or not out.is_file():
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "error" in ln.lower()), "")
        return None, f"exit {done.returncode}: {last[:300]} | {done.stderr.strip()[-1500:]}"
    return json.loads(done.stdout), ""


def git_commit() -> str | None:
    """The checkout's commit, where git and .git are there (the device's copy may lack them)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    """Replace `path` (this run's own file) atomically; partial results survive a kill."""
    if path is None:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; this is a report
    os.replace(tmp, path)


def print_row(r: dict[str, Any]) -> None:
    def ms(v: float | None) -> str:
        return f"{v * 1e3:9.1f}" if v is not None else "        -"

    def gib(v: float | None) -> str:
        return f"{v / 2**30:7.2f}" if v is not None else "      -"

    def pct(v: float | None) -> str:
        return f"{v:6.1%}" if v is not None else "     -"

    p, m = r["predicted"], r["measured"]
    d, f = p["datasheet"] or {}, p["measured_profile"] or {}
    print(f"{r['plan']:<22} {r['status']:<9} {ms(m['step_time_s'])} {ms(d.get('step_time_s'))} "
          f"{ms(f.get('step_time_s'))}  {gib(m['peak_allocated_bytes'])} "
          f"{gib(d.get('memory_allocated_bytes'))} {gib(f.get('memory_allocated_bytes'))}  "
          f"{pct(r['mfu']['measured'])} {pct(r['mfu']['datasheet'])} "
          f"{pct(r['mfu']['measured_profile'])}", flush=True)


HEADER = (f"{'plan':<22} {'status':<9} {'meas ms':>9} {'pred(ds)':>9} {'pred(ms)':>9}  "
          f"{'meas GiB':>7} {'ds GiB':>7} {'mp GiB':>7}  {'MFU':>6} {'ds MFU':>6} {'mp MFU':>6}")


def run_plans(args: argparse.Namespace, work: Path, datasheet: str, measured: str | None,
              peak: float, deadline: float, report: dict[str, Any]) -> None:
    from autoplan.plan import plan_from_dict
    from autoplan.plan_files import save_plan
    from autoplan.tune.runner import run_trial

    print(HEADER, flush=True)
    failures = 0
    for i, knobs in enumerate(args.plans):
        plan = plan_from_dict(plan_data(args.model, datasheet, knobs, args.global_batch_size,
                                        args.precision))
        tdir = work / f"plan{i}"
        path = save_plan(plan, tdir / "plan.yaml")
        predicted = {"datasheet": predict(plan, datasheet, args.device),
                     "measured_profile": predict(plan, measured, args.device)}
        steps = args.offload_steps if knobs.get("offload") else args.steps
        row: dict[str, Any] = {"plan": label(knobs), **knobs, "steps": steps,
                               "predicted": predicted, "reason": ""}
        left = deadline - time.monotonic()
        cannot = runtime_problem(plan)
        if cannot:  # the runtime's own refusal (no fp8 tensor cores, no torchao): not a failure
            row["status"], row["reason"] = "skipped", cannot
            outcome = None
        elif left < MIN_PLAN_S or failures >= args.max_failures:
            row["status"] = "skipped"
            row["reason"] = ("time budget spent" if left < MIN_PLAN_S
                             else f"{failures} plans failed before it")
            outcome = None
        else:
            outcome = run_trial(path, 1, steps, tdir, timeout_s=min(args.plan_timeout_s, left))
            row["status"], row["reason"] = outcome.status, outcome.reason
            failures += outcome.status != "complete"
            if outcome.status != "complete":
                row["stderr_tail"] = (tdir / "stderr.log").read_text(errors="replace")[-3000:]
        times = outcome.step_times_s if outcome else []
        meas_s = steady_median(times, args.warmup)
        meas_b = outcome.peak_memory_bytes if outcome else None
        row["measured"] = {"step_time_s": meas_s, "step_times_s": times,
                           "peak_allocated_bytes": meas_b,
                           "wall_s": outcome.wall_s if outcome else None}
        flops = (predicted["datasheet"] or {}).get("model_flops_per_step")
        row.update(compare(meas_s if row["status"] == "complete" else None, meas_b, flops, peak,
                           predicted))
        report["plans"].append(row)
        report["summary"] = summarize(report["plans"])
        write_json(args.json, report)
        print_row(row)
        if row["reason"]:
            print(f"  {row['reason'][:300]}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, a tiny tied Llama, cpu-gloo, "
                    "4 steps, 4 of the plans: the whole flow in under 2 minutes")
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default cuda (cpu with --dry-run)")
    ap.add_argument("--model", help="model preset or spec path (default Llama 3.2 1B)")
    ap.add_argument("--datasheet", help="profile to compare with (default: the GPU's datasheet)")
    ap.add_argument("--steps", type=int, help="steps per plan (default 12; 4 with --dry-run)")
    ap.add_argument("--offload-steps", type=int, help="steps of the offload plan (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--global-batch-size", type=int, help="sequences per step (default 8)")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="whole check, profile included")
    ap.add_argument("--profile-timeout-s", type=float, default=150.0)
    ap.add_argument("--plan-timeout-s", type=float, default=120.0)
    ap.add_argument("--max-failures", type=int, default=2, help="skip the rest after this many")
    ap.add_argument("--profile-dir", type=Path, help="where the measured profile goes "
                    "(default profiles/; the work folder with --dry-run)")
    ap.add_argument("--json", type=Path, help="report file (default $OUT/gpu_check.json)")
    ap.add_argument("--force", action="store_true", help="replace an existing --json file")
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.device = args.device or ("cpu" if dry else "cuda")
    args.model = args.model or str(MODEL_DRY if dry else MODEL_1B)
    args.steps = args.steps or (4 if dry else 12)
    args.offload_steps = args.offload_steps or (4 if dry else 8)
    args.global_batch_size = args.global_batch_size or (4 if dry else 8)
    args.plans = [PLANS[i] for i in DRY_RUN_PLANS] if dry else list(PLANS)
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "gpu_check.json"
    if args.json is not None and args.json.exists() and not args.force:
        raise ConfigError("--json", f"{str(args.json)!r} already exists",
                          "choose another path or pass --force")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    if any(v < 1 for v in (args.steps, args.offload_steps, args.global_batch_size)):
        raise ConfigError("--steps/--offload-steps/--global-batch-size", "got a value below 1",
                          "expected positive integers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (an outer `timeout`) unwinds like an exception, so the running trial's ranks are
    # killed (tune.runner) and the JSON written after the last finished plan stays whole
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    deadline = start + args.budget_s
    import torch

    from autoplan.hardware import load_profile
    from autoplan.profiler.cli import _gpu_base  # the datasheet `autoplan profile` starts from

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "cuda, but torch sees no CUDA device",
                          "run on the GPU machine, or pass --dry-run")
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    datasheet = args.datasheet or (_gpu_base(gpu) if gpu else "cpu-gloo")
    peak = load_profile(datasheet).device.peak(args.precision)
    # The host optimizer (offload) runs in the rank's process: give it the cores `autoplan
    # profile` measured CPU Adam with (all of them on a GPU; one per rank on CPU). `autoplan
    # train` alone would default OMP_NUM_THREADS to 1 (runtime/launch.py).
    threads = str(len(os.sched_getaffinity(0))) if gpu else "1"
    os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", threads)
    # the children (profile, torchrun and its ranks) import this source tree, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    (ROOT / "runs" / "gpu_check").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-", time.gmtime()),
                                 dir=ROOT / "runs" / "gpu_check"))
    prof_dir = args.profile_dir or (work if args.dry_run else ROOT / "profiles")
    name, prof_path = fresh_profile_path(prof_dir, f"{datasheet}-measured")
    report: dict[str, Any] = {
        "device": gpu or platform.processor() or platform.machine(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "commit": git_commit(),
        "model": args.model, "precision": args.precision, "datasheet_profile": datasheet,
        "datasheet_peak_flops_per_s": peak, "global_batch_size": args.global_batch_size,
        "warmup_steps": args.warmup, "work_dir": str(work), "plans": [],
    }
    summary, why = run_profile(args, prof_path, name, min(args.profile_timeout_s,
                                                           deadline - time.monotonic()))
    report["measured_profile"] = str(prof_path) if summary else None
    report["profile_summary"] = summary if summary else {"error": why}
    print(f"profile: {'wrote ' + str(prof_path) if summary else 'failed: ' + why[:400]} "
          f"({time.monotonic() - start:.0f} s)", flush=True)
    if summary and summary.get("fp8_matmul") is not None:  # the figure the note keeps
        fp8 = summary.get("fp8_measured")
        if not fp8:
            source = f"the datasheet's: {summary.get('fp8_why')}"
        else:
            source = (f"measured {fp8['ratio']:.3f}: forward {fp8['forward_ratio']:.3f} (fast "
                      f"accumulation), backward {fp8['backward_ratio']:.3f}"
                      + ("" if fp8["applied"] else ", not applied: the datasheet's kept"))
        print(f"profile: fp8_matmul {summary['fp8_matmul']:.3f} ({source})", flush=True)
    if summary and args.json is not None:
        shutil.copy2(prof_path, args.json.parent / prof_path.name)
    write_json(args.json, report)
    run_plans(args, work, datasheet, str(prof_path) if summary else None, peak, deadline,
              report)
    report["elapsed_s"] = time.monotonic() - start
    write_json(args.json, report)
    s = report.get("summary") or summarize(report["plans"])
    print(f"\ncompleted {s['completed']} of {s['plans']} plans in {report['elapsed_s']:.0f} s")
    for prof in ("datasheet", "measured_profile"):
        t, m = s[prof]["step_time_median_abs_error"], s[prof]["memory_median_abs_error"]
        print(f"  {prof:<17} median |error|: step time "
              f"{'-' if t is None else f'{t:.1%}'}, peak allocated memory "
              f"{'-' if m is None else f'{m:.1%}'} (n={s[prof]['n']})")
    mfu = s["measured_mfu_median"]
    print(f"  measured MFU median: {'-' if mfu is None else f'{mfu:.1%}'}")
    if args.json is not None:
        print(f"wrote {args.json}")
    return 0 if s["completed"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AutoplanError as err:
        sys.stderr.write(f"gpu_check: error: {err}\n")
        sys.exit(err.exit_code)
