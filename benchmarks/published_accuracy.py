"""Score the cost model against measured runs from published papers.

Reads ../shared/data/published-open.yaml (or --data PATH), predicts the step time of every run
marked `test_quality: complete`, and prints predicted against measured per run and the mean
absolute percentage error. Nothing is fitted to these runs: the profile's efficiency curves are
datasheet/microbenchmark figures.

Measured step time: `measured.iteration_time_s` where published; otherwise it is derived from
the published TFLOP/s per GPU with that paper's own FLOP count (`flops_convention`): Megatron
SC21 eq. 3, 96*B*s*l*h^2*(1 + s/6h + V/16lh) per iteration, i.e. with the recompute forward.

Run: python benchmarks/published_accuracy.py [--data PATH] [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import ModelSpec
from autoplan.plan import plan_from_dict

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "published-open.yaml"
GPU_PROFILES = {"A100-SXM4-80GB": "a100-sxm4-80gb", "A100-SXM4-40GB": "a100-sxm4-40gb",
                "H100-SXM5-80GB": "h100-sxm-80gb", "V100-SXM2-32GB": "v100-sxm2-32gb"}


def sc21_flops_per_iteration(run: dict) -> float:
    """Narayanan et al. 2021, eq. 3 (counts the recompute forward pass)."""
    m, p = run["model"], run["plan"]
    B, s, L, h, V = p["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"]
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def measured_step_time_s(run: dict) -> float | None:
    meas = run["measured"]
    if meas.get("iteration_time_s"):
        return float(meas["iteration_time_s"])
    convention = run.get("flops_convention", "")
    if meas.get("tflops_per_gpu") and ("96*B*s*l*h^2" in convention or "eq. (3)" in convention):
        return sc21_flops_per_iteration(run) / (meas["tflops_per_gpu"] * 1e12 * run["cluster"]["gpus"])
    return None


def run_to_plan(run: dict):
    m, p, c = run["model"], run["plan"], run["cluster"]
    model = ModelSpec(
        name=run["id"], num_layers=m["layers"], hidden_size=m["hidden"], num_heads=m["heads"],
        num_kv_heads=m.get("kv_heads"), ffn_hidden_size=m.get("ffn_hidden"),
        vocab_size=m["vocab"], seq_len=m["seq_len"], dropout=0.1,
    )
    vpp = p.get("vpp") or 1
    precision = "fp16" if "fp16" in str(run.get("precision")) else "bf16"
    plan = plan_from_dict({
        "model": "inline", "cluster": {"profile": GPU_PROFILES[c["gpu"]], "num_gpus": c["gpus"]},
        "parallel": {"dp": p["dp"], "tp": p["tp"], "pp": p["pp"], "cp": p.get("cp") or 1},
        "sequence_parallel": bool(p.get("sp")),
        "pipeline": {"schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "vpp": vpp},
        "zero_stage": p.get("zero_stage") or 0,
        "recompute": {"policy": p.get("recompute") or "none"},
        "batch": {"micro_batch_size": p["micro_batch"], "global_batch_size": p["global_batch"]},
        "precision": precision, "attention": "eager",  # 2021-22 Megatron-LM: unfused attention
    }).replace(model=model)
    cluster = ClusterSpec(load_profile(GPU_PROFILES[c["gpu"]]), c["gpus"])
    return plan, model, cluster


def score(data_path: Path) -> list[dict]:
    runs = yaml.safe_load(data_path.read_text())["runs"]
    rows = []
    for run in runs:
        if run.get("test_quality") != "complete" or run["cluster"]["gpu"] not in GPU_PROFILES:
            continue
        measured = measured_step_time_s(run)
        if measured is None:
            continue
        plan, model, cluster = run_to_plan(run)
        est = estimate_plan(plan, cluster, model)
        rows.append({
            "id": run["id"], "gpus": run["cluster"]["gpus"], "measured_s": measured,
            "predicted_s": est.step_time_s, "error": est.step_time_s / measured - 1.0,
            "feasible": est.feasible, "mfu": est.mfu, "dominant": est.dominant,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        sys.stderr.write(f"published_accuracy: no data file at {args.data}; pass --data PATH\n")
        return 2
    rows = score(args.data)
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    if args.format == "json":
        print(json.dumps({"runs": rows, "mape": mape}, indent=2))
        return 0
    print(f"{'run':38} {'GPUs':>5} {'measured s':>11} {'predicted s':>12} {'error':>7}  dominant")
    for r in rows:
        flag = "" if r["feasible"] else "  (predicted infeasible)"
        print(f"{r['id']:38} {r['gpus']:>5} {r['measured_s']:>11.3f} {r['predicted_s']:>12.3f} "
              f"{r['error']:>+7.1%}  {r['dominant']}{flag}")
    print(f"\n{len(rows)} runs, mean absolute percentage error {mape:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
