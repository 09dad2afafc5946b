"""Score the cost model on the practitioner set: published, measured production configurations.

Reads benchmarks/data/practitioner.yaml (or --data PATH) strictly, builds each configuration's
plan with `autoplan.plan.plan_from_dict` on the profile shipped in profiles/ (never a user's
profile of the same name), estimates it with `estimate_plan` (passing the configuration's
runtime when the cost model takes a `runtime=` keyword) and prints measured against predicted
step time, memory where published, feasibility and MFU. It measures; it does not judge: the
exit status is 0 once the table is printed (2 on a malformed data file).

Measured figures are the sources' own; figures the sources do not state are derived with the
formula named in the entry's `derived` block, and `derive()` below recomputes them (the unit
test holds every derived figure to its formula).

Run: python benchmarks/practitioner.py [--data PATH] [--format table|json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.params import total_params
from autoplan.cost.runtimes import RuntimeTraits, runtime_from_dict
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, ClusterSpec, load_profile
from autoplan.model_spec import ModelSpec, load_model
from autoplan.plan import Plan, plan_from_dict

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "practitioner.yaml"
PROFILES = Path(__file__).resolve().parents[1] / "profiles"
RUNTIMES = ("megatron", "megatron-deepep", "nemo", "torchtitan", "deepspeed", "llm-foundry",
            "nanotron")
"""nemo: Megatron-Core as NeMo's recipes run it, with Transformer Engine's TP comm overlap
(rows whose source states ub_tp_comm_overlap true). llm-foundry: MosaicML's stack (the MPT
tables of benchmarks/data/mpt-llm-foundry.yaml). nanotron: Hugging Face's (the old_bench sweep,
benchmarks/data/nanotron-old-bench.yaml)."""
MEASURED_FIGURES = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                    "peak_memory_gib")
TOP_KEYS = {"schema_version", "title", "note", "configurations"}
ENTRY_KEYS = {"id", "source", "runtime", "runtime_traits", "scored", "model", "cluster", "plan",
              "measured", "derived", "assumed", "notes"}
SOURCE_KEYS = {"id", "title", "authors", "year", "where", "url", "also"}
CLUSTER_KEYS = {"profile", "num_gpus", "gpu_as_run"}
MEASURED_KEYS = set(MEASURED_FIGURES) | {"stated", "memory_basis"}
DERIVED_KEYS = {"method", "inputs", "arithmetic"}


# --- FLOP conventions the sources use (each cited) -------------------------------------------

def flops_per_token(convention: str, model: ModelSpec) -> float:
    """Model FLOPs per trained token (forward + backward) under a source's own convention."""
    L, h, s, V = model.num_layers, model.hidden_size, model.seq_len, model.vocab_size
    if convention == "nemo-llama":
        # NVIDIA DGX Cloud benchmarking recipes, llama3.1/README_*.md "Notes" (NeMo 24.09):
        # 12*L*h^2*(1 + g/a + s/h) + 18*L*ffn*h + 6*V*h per token (full s^2 attention).
        g, a = model.kv_heads, model.num_heads
        return 12 * L * h**2 * (1 + g / a + s / h) + 18 * L * model.ffn * h + 6 * V * h
    if convention == "megatron-sc21":
        # Narayanan et al. 2021 (SC21), eq. 3 divided by B*s: counts the recompute forward.
        return 96 * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    if convention == "korthikanti-eq7":
        # Korthikanti et al. 2022, Appendix A eq. 7 divided by B*s: model FLOPs (no recompute).
        return 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    if convention in ("megatron-moe", "megatron-moe-causal"):
        # Megatron-LM megatron/training/training.py num_floating_point_operations (MCore
        # v0.8-0.9, no shared experts): 12*L*h^2*((1 + g/a + s/h)*a*d/h + f_e*k*(3/2 if SwiGLU)/h
        # + V/(2*L*h)) per token, f_e the expert FFN width, k the experts each token is sent to.
        # megatron-moe-causal: the same as Megatron-LM counts it from 2025 ("Only half of the
        # attention matrix is non-zero and needs to be multiplied with V": s/(2h) for s/h). The
        # MoE Model Zoo's Qwen3 table counts so: its EP 32 row's 19.7 s at 245 TFLOP/s is
        # 148.0 GFLOP/token here, 167.0 under megatron-moe.
        assert model.moe is not None, f"{convention} counts a mixture-of-experts model"
        g, a = model.kv_heads, model.num_heads
        gated = 1.5 if model.gated_mlp else 1.0
        routed = model.moe.expert_ffn_hidden_size * model.moe.experts_per_token
        core = s / (2 * h) if convention == "megatron-moe-causal" else s / h
        return 12 * L * h**2 * ((1 + g / a + core) * model.q_width / h + routed * gated / h
                                + V / (2 * L * h))
    if convention == "palm":
        # Chowdhery et al. 2022 (PaLM), Appendix B: 6*N + 12*L*h*s per token (full s^2
        # attention), N every parameter; Hagemann et al. 2023 count MFU so (their Appendix).
        return 6.0 * total_params(model) + 12.0 * L * h * s
    if convention == "nanotron":
        # nanotron models/llama.py get_flops, per token: 3 x (the forward's GEMMs: q, k, v and
        # output projections, 3 * h * ffn for SwiGLU's two inputs and its output, the
        # logits) with full s^2 attention (q.k and p.v, 2*a*d*s each); the log's
        # model_tflops_per_gpu is this times tokens/s/GPU
        a, d, g = model.num_heads, h // model.num_heads, model.kv_heads
        forward = L * (2 * h * (a + 2 * g) * d + 4 * a * s * d + 2 * a * d * h
                       + 6 * h * model.ffn) + 2 * h * V
        return 3.0 * forward
    if convention == "6n":
        # Kaplan et al. 2020 / torchtitan's 6*N part: 6 FLOPs per parameter per token.
        return 6.0 * total_params(model)
    raise ConfigError("derived.inputs.flops_convention", f"got {convention!r}",
                      "use nemo-llama, megatron-sc21, korthikanti-eq7, megatron-moe, "
                      "megatron-moe-causal, palm, nanotron or 6n")


def _tokens_per_step(entry: dict[str, Any], model: ModelSpec) -> float:
    return entry["plan"]["batch"]["global_batch_size"] * model.seq_len


def derive(entry: dict[str, Any], figure: str, model: ModelSpec) -> float:
    """Recompute one derived measured figure from the entry's fields and its stated method."""
    spec = entry["derived"][figure]
    method, inputs = spec["method"], spec.get("inputs") or {}
    meas, gpus = entry["measured"], entry["cluster"]["num_gpus"]
    tokens = _tokens_per_step(entry, model)
    if method == "step_from_tokens_per_s_per_gpu":
        # step = global_batch * seq_len / (tokens/s/GPU * GPUs)
        return tokens / (meas["tokens_per_s_per_gpu"] * gpus)
    if method == "step_from_tflops":
        # step = global_batch * seq_len * FLOPs/token / (TFLOP/s/GPU * 1e12 * GPUs)
        fpt = flops_per_token(inputs["flops_convention"], model)
        return tokens * fpt / (meas["tflops_per_gpu"] * 1e12 * gpus)
    if method == "step_from_mfu":
        # step = global_batch * seq_len * FLOPs/token / (MFU * peak FLOP/s * GPUs)
        fpt = flops_per_token(inputs["flops_convention"], model)
        return tokens * fpt / (meas["mfu"] * inputs["peak_tflops"] * 1e12 * gpus)
    if method == "step_from_days":
        # step = days * 86400 * tokens per step / total tokens trained
        return inputs["days"] * 86400.0 * tokens / inputs["train_tokens"]
    if method == "tokens_per_s_per_gpu_from_step":
        return tokens / (meas["step_time_s"] * gpus)
    if method == "tokens_per_s_per_gpu_from_aggregate":
        return inputs["tokens_per_s"] / gpus
    if method == "tokens_per_s_per_gpu_from_samples":
        return inputs["samples_per_s"] * model.seq_len / gpus
    if method == "mfu_from_tflops":
        return meas["tflops_per_gpu"] / inputs["peak_tflops"]
    raise ConfigError(f"{entry['id']}: derived.{figure}.method", f"got {method!r}",
                      "see derive() in benchmarks/practitioner.py for the methods")


# --- strict loading ---------------------------------------------------------------------------

def _keys(where: str, data: Any, allowed: set[str], required: set[str] = frozenset()) -> None:
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {type(data).__name__}", "expected a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(where, f"unknown keys {unknown}", f"valid keys: {sorted(allowed)}")
    missing = sorted(required - set(data))
    if missing:
        raise ConfigError(where, f"missing keys {missing}", "add them (null where unpublished)")


def _check_entry(entry: Any, seen: set[str]) -> None:
    _keys("configuration", entry, ENTRY_KEYS,
          {"id", "source", "runtime", "model", "cluster", "plan", "measured", "notes"})
    where = f"configuration {entry['id']}"
    if entry["id"] in seen:
        raise ConfigError(f"{where}: id", "appears twice", "give every configuration its own id")
    seen.add(entry["id"])
    _keys(f"{where}: source", entry["source"], SOURCE_KEYS, {"title", "authors", "year", "where"})
    if entry["runtime"] not in RUNTIMES:
        raise ConfigError(f"{where}: runtime", f"got {entry['runtime']!r}",
                          f"choose one of {', '.join(RUNTIMES)}")
    row_runtime(entry)  # runtime_traits: fields of RuntimeTraits, strictly
    _keys(f"{where}: cluster", entry["cluster"], CLUSTER_KEYS, {"profile", "num_gpus"})
    _keys(f"{where}: measured", entry["measured"], MEASURED_KEYS,
          set(MEASURED_FIGURES) | {"stated"})
    derived = entry.get("derived") or {}
    for figure, spec in derived.items():
        if figure not in MEASURED_FIGURES:
            raise ConfigError(f"{where}: derived", f"unknown figure {figure!r}",
                              f"derive one of {list(MEASURED_FIGURES)}")
        _keys(f"{where}: derived.{figure}", spec, DERIVED_KEYS, {"method", "arithmetic"})
    for figure in entry["measured"]["stated"] or []:
        if figure not in MEASURED_FIGURES or figure in derived:
            raise ConfigError(f"{where}: measured.stated", f"lists {figure!r}",
                              "list published figures only, none that is also derived")


def load_data(path: Path) -> list[dict[str, Any]]:
    """The configurations of a practitioner data file, checked strictly (ConfigError if not)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--data {path}", f"cannot be read ({err})") from None
    _keys(f"--data {path}", data, TOP_KEYS, {"schema_version", "configurations"})
    if data["schema_version"] != 1:
        raise ConfigError("schema_version", f"got {data['schema_version']!r}", "expected 1")
    seen: set[str] = set()
    for entry in data["configurations"]:
        _check_entry(entry, seen)
    return data["configurations"]


def row_runtime(entry: dict[str, Any]) -> RuntimeTraits:
    """The traits the entry's run had: its runtime's preset, with the entry's `runtime_traits`
    (fields the source shows that run set otherwise, e.g. the fused RMSNorm of torchtitan's
    2024 configs) over it; the name stays the preset's."""
    return runtime_from_dict({"schema_version": 1, "base": entry["runtime"],
                              **(entry.get("runtime_traits") or {})},
                             f"configuration {entry['id']}: runtime_traits")


def source_id(entry: dict[str, Any]) -> str:
    """The publication an entry comes from: its source's `id` (one per publication, the same
    across the data files), else its full title."""
    return str(entry["source"].get("id") or entry["source"]["title"])


def packaged_profile(name: str) -> ClusterProfile:
    """The profile shipped in profiles/, by path: a user's profile of the same name (what
    `autoplan calibrate` writes to ~/.config/autoplan/profiles) must not change a score."""
    return load_profile(PROFILES / f"{name}.yaml", "cluster.profile")


def build(entry: dict[str, Any]) -> tuple[Plan, ModelSpec, ClusterSpec]:
    """The entry's Plan, ModelSpec and ClusterSpec, as `autoplan estimate` would build them
    on the packaged profile."""
    cluster_ref = {k: entry["cluster"][k] for k in ("profile", "num_gpus")}
    plan = plan_from_dict({"model": entry["model"], "cluster": cluster_ref, **entry["plan"]},
                          where=f"configuration {entry['id']}")
    model = load_model(plan.model)
    cluster = ClusterSpec(packaged_profile(cluster_ref["profile"]), cluster_ref["num_gpus"])
    return plan, model, cluster


# --- scoring ----------------------------------------------------------------------------------

def plan_summary(plan: Plan) -> str:
    p = plan.parallel
    parts = [f"dp{p.dp}", f"tp{p.tp}", f"pp{p.pp}", f"cp{p.cp}"]
    if plan.pipeline.vpp > 1:
        parts.append(f"v{plan.pipeline.vpp}")
    if plan.sequence_parallel:
        parts.append("sp")
    parts.append(f"z{plan.zero_stage}")
    if plan.offload.optimizer:
        parts.append("off")
    parts.append({"none": "rc0", "selective": "rcS", "full": "rcF"}[plan.recompute.policy.value])
    parts.append(f"m{plan.batch.micro_batch_size}/g{plan.batch.global_batch_size}")
    return " ".join(parts)


def _estimate(plan: Plan, cluster: ClusterSpec, model: ModelSpec, runtime: str):
    if "runtime" in inspect.signature(estimate_plan).parameters:
        return estimate_plan(plan, cluster, model, runtime=runtime)
    return estimate_plan(plan, cluster, model)


ALLOCATOR_COUNTERS = ("max reserved",)
"""Memory counters of PyTorch's caching allocator (torch.cuda.max_memory_reserved): they hold
what it reserved, slack included, and not the CUDA context or NCCL's buffers."""


def counter_gib(est: Any, basis: str | None) -> float:
    """The predicted figure the source's memory counter measures: the priced total, less the
    device's reserve outside the allocator (hardware_devices.DeviceSpec.reserved_bytes) where the
    counter is the allocator's own."""
    total = est.memory_total_bytes
    if basis and any(c in basis for c in ALLOCATOR_COUNTERS):
        total -= est.memory["reserved"]
    return total / 2**30


def score_entry(entry: dict[str, Any]) -> dict[str, Any]:
    plan, model, cluster = build(entry)
    est = _estimate(plan, cluster, model, row_runtime(entry))
    meas = entry["measured"]
    measured_s = meas["step_time_s"]
    return {
        "id": entry["id"], "runtime": entry["runtime"], "scored": entry.get("scored", True),
        "gpus": cluster.num_gpus, "profile": cluster.profile.name, "plan": plan_summary(plan),
        "measured_s": measured_s, "predicted_s": est.step_time_s,
        "error": est.step_time_s / measured_s - 1.0 if measured_s else None,
        "measured_mem_gib": meas["peak_memory_gib"],
        "predicted_mem_gib": est.memory_total_bytes / 2**30,
        "predicted_counter_gib": counter_gib(est, meas.get("memory_basis")),
        "feasible": est.feasible, "first_reason": est.reasons[0] if est.reasons else None,
        "measured_mfu": meas["mfu"], "predicted_mfu": est.mfu, "dominant": est.dominant,
        "moe": model.moe is not None,
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if r["scored"] and r["error"] is not None]
    errs = [abs(r["error"]) for r in scored]
    # peak memory where the source publishes it (every row, scored or not: FP8 runs too)
    mem = sorted(abs(r["predicted_counter_gib"] / r["measured_mem_gib"] - 1.0) for r in rows
                 if r["measured_mem_gib"])
    return {
        "scored": len(errs),
        "mean_abs_error": _mean(errs),
        "within_10pct": sum(e <= 0.10 for e in errs) / len(errs) if errs else None,
        "feasible_where_ran": sum(r["feasible"] for r in scored),
        "dense_mean_abs_error": _mean([abs(r["error"]) for r in scored if not r["moe"]]),
        "dense_scored": sum(not r["moe"] for r in scored),
        "moe_mean_abs_error": _mean([abs(r["error"]) for r in scored if r["moe"]]),
        "moe_scored": sum(r["moe"] for r in scored),
        "memory_rows": len(mem),
        "memory_median_abs_error": mem[len(mem) // 2] if mem else None,
        "by_profile": {p: {"scored": len(e), "mean_abs_error": _mean(e),
                           "within_10pct": sum(x <= 0.10 for x in e) / len(e)}
                       for p in sorted({r["profile"] for r in scored})
                       for e in [[abs(r["error"]) for r in scored if r["profile"] == p]]},
    }


def _fmt(value: float | None, spec: str, width: int) -> str:
    return ("-" if value is None else format(value, spec)).rjust(width)


def print_table(rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    head = (f"{'configuration':50} {'runtime':10} {'GPUs':>5}  {'plan':44} {'meas s':>8} "
            f"{'pred s':>8} {'error':>7} {'mem GiB m/p':>12} {'MFU m/p':>11}  feasible")
    for title, keep in (("scored (bf16/fp16 as run)", True), ("not scored", False)):
        part = [r for r in rows if r["scored"] is keep]
        if not part:
            continue
        print(f"\n{title}\n{head}")
        for r in part:
            pred = r["predicted_counter_gib" if r["measured_mem_gib"] else "predicted_mem_gib"]
            mem = f"{_fmt(r['measured_mem_gib'], '.1f', 5)}/{pred:<6.1f}"
            mfu = f"{_fmt(r['measured_mfu'], '.0%', 4)}/{r['predicted_mfu']:<5.0%}"
            ok = "yes" if r["feasible"] else f"no: {r['first_reason']}"
            print(f"{r['id']:50} {r['runtime']:10} {r['gpus']:>5}  {r['plan']:44} "
                  f"{_fmt(r['measured_s'], '.2f', 8)} {r['predicted_s']:>8.2f} "
                  f"{_fmt(r['error'], '+.1%', 7)} {mem:>12} {mfu:>11}  {ok}")
    if not stats["scored"]:
        print("\nno scored configurations")
        return
    print(f"\n{stats['scored']} scored configurations: mean absolute error "
          f"{stats['mean_abs_error']:.1%}, within 10%: {stats['within_10pct']:.0%}, "
          f"predicted feasible: {stats['feasible_where_ran']} of {stats['scored']}")
    for kind in ("dense", "moe"):
        if stats[f"{kind}_scored"]:
            print(f"  {kind}: {stats[f'{kind}_scored']} scored, mean absolute error "
                  f"{stats[f'{kind}_mean_abs_error']:.1%}")
    if len(stats["by_profile"]) > 1:
        for name, b in stats["by_profile"].items():
            print(f"  on {name}: {b['scored']} scored, mean absolute error "
                  f"{b['mean_abs_error']:.1%}, within 10%: {b['within_10pct']:.0%}")
    if stats["memory_rows"]:
        print(f"peak memory, {stats['memory_rows']} configurations that publish it: median "
              f"absolute error {stats['memory_median_abs_error']:.1%} (against the counter each "
              "publishes: PyTorch's max reserved is the priced total less the reserve outside "
              "the allocator)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    try:
        rows = [score_entry(e) for e in load_data(args.data)]
    except ConfigError as err:
        sys.stderr.write(f"practitioner: {err}\n")
        return 2
    stats = summary(rows)
    if args.format == "json":
        print(json.dumps({"configurations": rows, **stats}, indent=2))
    else:
        print_table(rows, stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
