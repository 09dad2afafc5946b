"""Score the cost model against measured runs from published papers.

Reads tests/data/published/published-open.yaml (or --data PATH, any file of that schema: its
`units` block says what each field holds; a file of the practitioner set's schema is scored as
benchmarks/practitioner.py scores it), prices every run marked `test_quality: complete` as
its software ran it and prints predicted against measured per run (and peak memory where the
run publishes it), the mean absolute percentage error with how many of those runs are predicted
not to fit, and the runs it does not score with the reason for each. The schema names a
framework, a GPU and a model's shape, not a runtime preset, a profile or an architecture:
published_schema.py reads those off what the run does say (the framework's name and year, the
GPU's name, the published parameter count, the FLOP convention of a published TFLOP/s), states
each rule, lists a run it cannot read with the field that stopped it, and never prices one on
another GPU's figures. Nothing is fitted to these runs: the profile's efficiency curves are
datasheet/microbenchmark figures, so the leave-one-source-out error equals the plain one; what
is estimated from residuals is the error band, and that is checked leaving each source out (one
publication: a run's `source_id`, else the arXiv id or URL its `source` cites; a practitioner
entry's `source.id`): does a run fall inside the band its kind gets from the other sources, and
which band was it? With the practitioner set (benchmarks/data/practitioner.yaml) and the
measured sweeps (MosaicML's MPT tables, benchmarks/data/mpt-llm-foundry.yaml; BigScience's BLOOM
layout search, benchmarks/data/bloom-tr11-topology.yaml; Hugging Face's nanotron layout sweep,
benchmarks/data/nanotron-old-bench.yaml) it also reports, for groups of runs of one model on one
cluster, whether the run a search would pick (the predicted-fastest of those predicted to fit)
is the measured-fastest, both per token: step time / (global batch x sequence length), as the
runs of a group may differ in batch; `--write-bands` writes autoplan/cost/error_bands.yaml.
Runs are priced on the profiles shipped in profiles/, never on a user's profile of that name.

Measured step time: `measured.iteration_time_s` where published; else the global batch's tokens
over the published tokens/s (per GPU or in all); else from the published TFLOP/s per GPU (or
MFU and its stated peak) with the paper's own FLOP count (`flops_convention`: Megatron SC21
eq. 3, Korthikanti et al. eq. 7, PaLM's 6N + 12Lhs, 6N).

Run: python benchmarks/published_accuracy.py [--data PATH] [--format table|json] [--write-bands]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtime_rules import refusals
from autoplan.errors import ConfigError
from autoplan.plan_rules import validate_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
import practitioner  # noqa: E402  (the sibling script: its loader, plan builder and profiles)
import published_schema  # noqa: E402  (reads a run of the published schema as it ran)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "tests" / "data" / "published" / "published-open.yaml"
BANDS = ROOT / "autoplan" / "cost" / "error_bands.yaml"


def load_runs(data_path: Path) -> list[dict]:
    """The file's runs; a file that is not the published schema is a one-line error."""
    data = yaml.safe_load(data_path.read_text())
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        raise ConfigError(f"--data {data_path}", "has no list of runs under `runs`",
                          "give a file in the schema of tests/data/published/published-open.yaml"
                          " (or of benchmarks/data/practitioner.yaml, under `configurations`)")
    return runs


def _priced(run: dict, recompute: str | None = None) -> tuple[dict, list[str], Any]:
    """(the run's practitioner-schema entry, what it assumed, (plan, model, cluster, the
    estimate)), priced as it ran (published_schema.to_entry), with `recompute` in place of its
    policy where given. A plan as read that breaks a rule, or that the runtime read off its
    framework cannot run, is no prediction of the run: a ConfigError, so the run is listed,
    not counted as "predicted not to fit"."""
    if recompute is not None:
        run = {**run, "plan": {**run["plan"], "recompute": recompute}}
    entry, assumed = published_schema.to_entry(run)
    plan, model, cluster = practitioner.build(entry)
    traits = practitioner.row_runtime(entry)
    problems = validate_plan(plan, model, cluster) + refusals(plan, traits, model,
                                                              cluster.profile.device)
    if problems:
        raise ConfigError("", problems[0])
    est = estimate_plan(plan, cluster, model, runtime=traits)
    return entry, assumed, (plan, model, cluster, est)


def _scored_row(run: dict, measured: float, how: str) -> dict:
    entry, assumed, (plan, model, cluster, est) = _priced(run)
    mem = published_schema.measured_memory_gib(run)
    counter = practitioner.counter_gib(est, published_schema.memory_basis(run))
    return {
        "id": entry["id"], "gpus": cluster.num_gpus, "measured_s": measured,
        "measured_from": how, "predicted_s": est.step_time_s,
        "error": est.step_time_s / measured - 1.0,
        "feasible": est.feasible, "reason": est.reasons[0] if est.reasons else None,
        "mfu": est.mfu, "dominant": est.dominant, "source": entry["source"]["id"],
        "runtime": entry["runtime"], "profile": cluster.profile.name,
        "plan": practitioner.plan_summary(plan), "assumed": assumed,
        "measured_mem_gib": mem, "predicted_mem_gib": counter,
        "memory_error": None if mem is None else counter / mem - 1.0,
        "group": published_schema.group_of(run),
        "tokens": plan.batch.global_batch_size * model.seq_len,
        "kind": _kind(plan), "scale": _scale(plan, cluster),
        "device": cluster.profile.device.name, "precision": plan.precision.value,
        "seq_len": model.seq_len,
    }


def _skipped(run: dict, reason: str, measured: float | None) -> dict:
    """A run `read` lists: its reason; where the recompute policy is all it leaves
    unpublished, the step predicted under recompute none and full beside the measured one
    (not scored: which policy ran is unknown)."""
    row = {"id": run["id"], "reason": reason, "measured_s": measured,
           "runtime": published_schema.runtime_of(run), "predicted": {}}
    unpublished = [k for k in published_schema.PLAN_FIELDS if run["plan"][k] is None]
    if unpublished == ["recompute"] and published_schema.profile_of(run) is not None:
        for policy in ("none", "full"):
            try:
                *_, (_, _, _, est) = _priced(run, recompute=policy)
            except ConfigError:
                continue  # the runtime cannot run that policy: nothing to show
            row["predicted"][policy] = {"step_s": est.step_time_s, "feasible": est.feasible}
    return row


def _read_one(raw: Any, index: int) -> tuple[dict | None, dict | None]:
    """(the scored row, None) or (None, the listed row) for one run of the file. A field that
    cannot be read (published_schema.clean), a model or plan the tool refuses, or no measured
    step: listed with the one-line reason, never raised."""
    try:
        run = published_schema.clean(raw, index)
    except ConfigError as err:
        rid = raw.get("id") if isinstance(raw, dict) else None
        return None, {"id": str(rid or f"runs[{index}]"), "reason": str(err),
                      "measured_s": None, "runtime": None, "predicted": {}}
    reason = published_schema.why_not_priced(run)
    measured, how = None, ""
    if reason is None or reason.startswith("test_quality"):
        try:
            measured, how = published_schema.measured_step_s(run,
                                                             published_schema.model_of(run))
        except ConfigError as err:
            reason = reason or f"the model as read is refused: {err}"
    if reason is None and measured is None:
        reason = how
    if reason is None:
        assert measured is not None
        try:
            return _scored_row(run, measured, how), None
        except ConfigError as err:
            reason = f"the plan as read is refused: {err}"
    try:
        return None, _skipped(run, reason, measured)
    except ConfigError:
        return None, {"id": run["id"], "reason": reason, "measured_s": measured,
                      "runtime": None, "predicted": {}}


def _read_practitioner(data_path: Path) -> tuple[list[dict], list[dict]]:
    """(the scored rows, the listed ones) of a file of the practitioner set's schema (its
    `configurations`, read strictly by practitioner.load_data), each priced with the runtime
    and traits it names, as practitioner.py does."""
    scored, listed = [], []
    for entry in practitioner.load_data(data_path):
        rows = _row(entry) if entry.get("scored", True) else []
        for row in rows:
            mem = row["measured_mem_gib"]
            scored.append({**row, "predicted_mem_gib": row["predicted_counter_gib"],
                           "memory_error": mem and row["predicted_counter_gib"] / mem - 1.0,
                           "assumed": []})
        if not rows:
            listed.append({"id": entry["id"], "measured_s": entry["measured"]["step_time_s"],
                           "runtime": entry["runtime"], "predicted": {},
                           "reason": "scored: false in the file" if not entry.get("scored", True)
                           else "no measured step time"})
    return scored, listed


def read(data_path: Path) -> tuple[list[dict], list[dict]]:
    """(the scored rows, the listed runs) of a file of the published schema, each run read once
    (published_schema: priced as it ran, with a measured step); a file of the practitioner
    set's schema (`configurations`) is scored as practitioner.py scores it."""
    data = yaml.safe_load(data_path.read_text())
    if isinstance(data, dict) and "configurations" in data:
        return _read_practitioner(data_path)
    scored, listed = [], []
    for index, raw in enumerate(load_runs(data_path)):
        row, skipped = _read_one(raw, index)
        if row is not None:
            scored.append(row)
        if skipped is not None:
            listed.append(skipped)
    return scored, listed


def score(data_path: Path) -> list[dict]:
    """One row per run that can be priced as it ran and has a measured step."""
    return read(data_path)[0]


def not_scored(data_path: Path) -> list[dict]:
    """The runs `score` leaves out, each with its reason (see _skipped)."""
    return read(data_path)[1]


def _kind(plan) -> str:
    from autoplan.cost.error_band import KINDS, kind_of

    p = plan.parallel
    return KINDS[int(kind_of(p.tp, p.pp, p.cp, plan.model_spec().moe is not None))]


def _scale(plan, cluster) -> str:
    from autoplan.cost.error_band import SCALES, scale_of

    return SCALES[int(scale_of(plan.world_size, cluster.profile.gpus_per_node))]


SWEEPS = (ROOT / "benchmarks" / "data" / "mpt-llm-foundry.yaml",
          ROOT / "benchmarks" / "data" / "bloom-tr11-topology.yaml",
          ROOT / "benchmarks" / "data" / "nanotron-old-bench.yaml")
"""Measured sweeps in the practitioner set's schema, scored beside it: MosaicML's MPT tables,
BigScience's BLOOM layout search and Hugging Face's nanotron layout sweep."""


def practitioner_rows() -> list[dict]:
    """The scored configurations of the practitioner set and of SWEEPS in this script's row
    shape."""
    return [row for entry in _entries() if entry.get("scored", True)
            for row in _row(entry)]


def fp8_rows() -> list[dict]:
    """The practitioner set's fp8 runs (unscored: the acceptance counts runs as the 16-bit
    ones; every fp8 run, torch.compile'd ones too, is what `estimate` prices an fp8 plan of
    its runtime against): their residuals give fp8 plans a band of their own."""
    return [row for entry in _entries() if entry["plan"].get("precision") == "fp8"
            for row in _row(entry)]


def _entries() -> list[dict]:
    return [e for path in (practitioner.DEFAULT_DATA, *SWEEPS)
            for e in practitioner.load_data(path)]


def _row(entry: dict) -> list[dict]:
    """[the entry in this script's row shape], or [] where it has no measured step."""
    row = practitioner.score_entry(entry)
    if row["error"] is None:
        return []
    plan, model, cluster = practitioner.build(entry)
    return [{**row, "source": practitioner.source_id(entry), "reason": row["first_reason"],
             # an inline model by its own name: sequence lengths apart are other
             # models (the same work per token only at the same length)
             "group": f"{model.name} on {cluster.num_gpus} x {cluster.profile.name}",
             "tokens": plan.batch.global_batch_size * model.seq_len,
             "kind": _kind(plan), "scale": _scale(plan, cluster),
             "device": cluster.profile.device.name, "precision": plan.precision.value,
             "mfu": row["predicted_mfu"], "seq_len": model.seq_len}]


def rms(errors: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.nan


def mape(rows: list[dict]) -> float:
    return sum(abs(r["error"]) for r in rows) / len(rows) if rows else math.nan


Z_05 = -1.6449
"""The standard normal's 5% quantile."""


def chi2_lower(n: int) -> float:
    """The 5% quantile of the chi-squared distribution with n degrees of freedom, by Wilson and
    Hilferty's cube-root approximation (1931): 7% below the tabled value at n = 3, 3% at 4,
    under 1% from 6 on (a lower quantile read low makes the band a little wider)."""
    c = 2.0 / (9.0 * n)
    return n * (1.0 - c + Z_05 * math.sqrt(c)) ** 3


def band_of(errors: list[float]) -> float:
    """The error band of a group: a one-sided 95% upper bound on its RMS relative error,
    rms * sqrt(n / chi2_05(n)), treating the n residuals as draws of a zero-mean error. Three
    runs leave the band 3x their RMS, sixteen 1.4x: a kind validated by few runs is not
    claimed to be known as well as one validated by many."""
    n = len(errors)  # fewer than 3 runs bound nothing useful (x8 at 2): no band of its own
    return rms(errors) * math.sqrt(n / chi2_lower(n)) if n >= 3 else math.nan


def bands(rows: list[dict], leave_out: str | None = None) -> dict:
    """(band, runs, bias, sources) per (family, kind, scale) and per family, from the rows not
    of source `leave_out`."""
    from autoplan.cost.error_band import family

    groups: dict = defaultdict(list)
    fams: dict = defaultdict(list)
    for r in rows:
        if r["source"] == leave_out:
            continue
        fam = family(r["runtime"])
        groups[(fam, r["kind"], r["scale"])].append(r)
        fams[fam].append(r)

    def summary(members: list[dict]) -> tuple:
        errors = [r["error"] for r in members]
        return band_of(errors), len(errors), bias_of(errors), len({r["source"] for r in members})

    return {"groups": {k: summary(v) for k, v in groups.items()},
            "families": {k: summary(v) for k, v in fams.items()}}


def bias_of(errors: list[float]) -> float:
    """Which way a group's runs miss: the mean of measured / predicted - 1 (+0.08: they took
    8% longer than priced), from the relative errors predicted / measured - 1."""
    return sum(1.0 / (1.0 + e) - 1.0 for e in errors) / len(errors) if errors else math.nan


def band_for(b: dict, r: dict, default: float = 0.25,
             min_runs: int = 3) -> tuple[float, str | None]:
    """The band `b` gives a row's kind and where it comes from: the row's (family, kind, scale)
    group if it has `min_runs` runs, else its family if that has, else `default` (origin None)."""
    from autoplan.cost.error_band import family

    fam = family(r["runtime"])
    empty = (math.nan, 0, math.nan, 0)
    for name, (band, n, _, k) in ((f"{fam} {r['kind']} {r['scale']}",
                                   b["groups"].get((fam, r["kind"], r["scale"]), empty)),
                                  (f"{fam} family", b["families"].get(fam, empty))):
        if n >= min_runs:
            return band, f"{name}: {n} runs from {k} source{'s' if k > 1 else ''}"
    return default, None


def leave_one_source_out(rows: list[dict]) -> dict:
    """Per source: its MAPE (nothing is fitted, so it is the same as in sample) and, per band
    its runs were tested against, that band, where it came from and how many runs fall inside."""
    out = {}
    for src in sorted({r["source"] for r in rows}):
        b = bands(rows, leave_out=src)
        mine = [r for r in rows if r["source"] == src]
        tested: dict = {}
        for r in mine:
            band, origin = band_for(b, r)
            t = tested.setdefault(origin, {"band": band, "origin": origin, "runs": 0, "inside": 0})
            t["runs"] += 1
            t["inside"] += int(abs(r["error"]) <= band)
        out[src] = {"runs": len(mine), "mape": mape(mine),
                    "inside_band": sum(t["inside"] for t in tested.values()),
                    "bands": list(tested.values())}
    return out


def coverage(loso: dict) -> dict:
    """[inside, tested] over every source: against a band of residuals, against the default."""
    out = {"residual": [0, 0], "default": [0, 0]}
    for v in loso.values():
        for t in v["bands"]:
            c = out["default" if t["origin"] is None else "residual"]
            c[0], c[1] = c[0] + t["inside"], c[1] + t["runs"]
    return out


def _per_token(r: dict, key: str) -> float:
    return r[key] / r["tokens"]


def first_choice(rows: list[dict]) -> list[dict]:
    """Groups of runs of one model on one cluster, compared per token (runs of a group may
    differ in global batch): is the run a search would pick, the predicted-fastest of those
    predicted to fit, the measured-fastest of all, and how much slower per token is it if not
    (regret)? None picked where no run of the group is predicted to fit."""
    groups: dict = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    out = []
    for name, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        fits = [r for r in members if r["feasible"]]
        best = min(members, key=lambda r: _per_token(r, "measured_s"))
        pick = min(fits, key=lambda r: _per_token(r, "predicted_s")) if fits else None
        out.append({"group": name, "runs": len(members), "feasible": len(fits),
                    "picked": pick and pick["id"], "fastest": best["id"],
                    "regret": pick and (_per_token(pick, "measured_s")
                                        / _per_token(best, "measured_s") - 1),
                    "spearman": rank_correlation(members)})
    return out


def rank_correlation(members: list[dict]) -> float | None:
    """Spearman's rank correlation of predicted and measured time per token over a group of at
    least three runs (ties share their mean rank), fitting or not: how well the cost model
    orders the layouts, beside whether it picks the fastest. None for fewer runs."""
    if len(members) < 3:
        return None
    import pandas as pd

    frame = pd.DataFrame({"measured": [_per_token(r, "measured_s") for r in members],
                          "predicted": [_per_token(r, "predicted_s") for r in members]})
    rho = frame["measured"].corr(frame["predicted"], method="spearman")
    return None if math.isnan(rho) else float(rho)


def _rounded(band: float) -> float | None:
    return None if math.isnan(band) else round(band, 4)


def fp8_bands(rows: list[dict]) -> list[dict]:
    """Per runtime family and class (dense or MoE), the band and bias of its fp8 runs' residuals
    (band_of, bias_of), as `bands` gives 16-bit runs theirs by kind and scale: fp8 runs are
    too few to split further."""
    from autoplan.cost.error_band import family

    groups: dict = defaultdict(list)
    for r in rows:
        groups[(family(r["runtime"]), "moe" if r["kind"] == "moe" else "dense")].append(
            r["error"])
    return [{"family": f, "class": c, "band": _rounded(band_of(e)), "bias": _rounded(bias_of(e)),
             "runs": len(e)} for (f, c), e in sorted(groups.items())]


def mfu_ceilings(rows: list[dict]) -> list[dict]:
    """Per runtime family (and every family together, error_band.ANY_FAMILY), GPU model
    (error_band.device_class), kind of parallelism (and, per family, every dense kind
    together, error_band.DENSE), context class and precision class (16-bit, fp8),
    the highest MFU the cost model predicts for the runs, with the run and the MFU it
    measured (predicted MFU x predicted / measured step: the cost model's FLOP count whatever
    convention the source used; an fp8 run's against the fp8 peak). Predicted against
    predicted: the model leans optimistic, so a plan of a kind the runs validate would read
    above their measured best."""
    from autoplan.cost.error_band import (
        ANY_FAMILY,
        DENSE,
        context_class,
        device_class,
        family,
        precision_class,
    )

    best: dict[tuple[str, ...], list[tuple[float, str, float]]] = {}
    for r in rows:
        device, prec = device_class(r["device"]), precision_class(r["precision"])
        if device is None or prec is None:
            continue
        entry = (r["mfu"], r["id"], r["mfu"] * (1.0 + r["error"]))
        kinds = (r["kind"],) if r["kind"] == "moe" else (r["kind"], DENSE)
        ctx = context_class(r["seq_len"])
        for kind in kinds:
            best.setdefault((family(r["runtime"]), device, kind, ctx, prec), []).append(entry)
        # every family's runs of the kind together (error_band.ANY_FAMILY)
        best.setdefault((ANY_FAMILY, device, r["kind"], ctx, prec), []).append(entry)
    # rounded up: the run behind a ceiling is never above it
    return [{"family": f, "device": d, "kind": k, "context": ctx, "precision": prec,
             "mfu": math.ceil(top[0] * 1e4) / 1e4, "run": top[1], "measured": round(top[2], 4),
             "runs": len(v)}
            for (f, d, k, ctx, prec), v in sorted(best.items()) for top in [max(v)]]


def write_bands(rows: list[dict], path: Path, fp8: list[dict]) -> None:
    b = bands(rows)
    data = {
        "schema_version": 1,
        "note": "One-sided 95% upper bound on the RMS relative step-time error of published "
                "measured runs by runtime family, kind of parallelism and scale (band_of), and "
                "the mean of measured / predicted - 1 over them (bias_of: + when they ran "
                "longer than priced); fp8: the same for fp8 plans, from the practitioner set's fp8 "
                "runs, per family and dense or MoE; mfu_ceilings: per runtime family, GPU "
                "model, kind, context and precision class, the highest MFU predicted for those "
                "runs, with the run and what it measured; estimate and search say when a plan "
                "is predicted above it; "
                "written by benchmarks/published_accuracy.py "
                "--write-bands from tests/data/published/published-open.yaml, "
                "benchmarks/data/practitioner.yaml and the sweeps "
                + ", ".join(f"benchmarks/data/{path.name}" for path in SWEEPS) + ". "
                "Nothing in the cost model is fitted to them.",
        "default": 0.25,
        "families": {k: {"band": _rounded(v), "bias": _rounded(m), "runs": n}
                     for k, (v, n, m, _) in sorted(b["families"].items())},
        "groups": [{"family": f, "kind": k, "scale": s, "band": _rounded(v),
                    "bias": _rounded(m), "runs": n}
                   for (f, k, s), (v, n, m, _) in sorted(b["groups"].items())],
        "fp8": fp8_bands(fp8),
        "mfu_ceilings": mfu_ceilings(rows + fp8),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# Generated: python benchmarks/published_accuracy.py --write-bands\n"
                   + yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def memory_summary(rows: list[dict]) -> dict:
    """Over the scored runs that publish their peak memory: how many, the median of
    |predicted / measured - 1| (None without any) and how many are predicted to fit."""
    with_memory = [r for r in rows if r.get("measured_mem_gib")]
    errors = sorted(abs(r["memory_error"]) for r in with_memory)
    n = len(errors)
    median = None if not n else (errors[n // 2] if n % 2 else
                                 (errors[n // 2 - 1] + errors[n // 2]) / 2)
    return {"runs": n, "median_abs_error": median,
            "predicted_to_fit": sum(r["feasible"] for r in with_memory)}


def print_runs(rows: list[dict], skipped: list[dict], every: list[dict],
               data_path: Path) -> None:
    print(f"{'run':38} {'GPUs':>5} {'runtime':13} {'measured s':>11} {'predicted s':>12} "
          f"{'error':>7}  {'mem GiB m/p':>12}  dominant")
    for r in rows:
        flag = "" if r["feasible"] else "  (predicted infeasible)"
        mem = (f"{r['measured_mem_gib']:.1f}/{r['predicted_mem_gib']:.1f}"
               if r.get("measured_mem_gib") else "-")
        print(f"{r['id'][:38]:38} {r['gpus']:>5} {r['runtime']:13} {r['measured_s']:>11.3f} "
              f"{r['predicted_s']:>12.3f} {r['error']:>+7.1%}  {mem:>12}  {r['dominant']}{flag}")
    unfit = [r for r in every if not r["feasible"]]
    print(f"\n{len(rows)} of the {len(rows) + len(skipped)} runs of {data_path.name} scored "
          f"(test_quality complete, the plan published, a measured step, a profiled GPU): "
          f"MAPE {mape(rows):.1%}, {sum(not r['feasible'] for r in rows)} of them predicted "
          f"not to fit")
    memory = memory_summary(rows)
    if memory["runs"]:
        print(f"peak memory, {memory['runs']} runs that publish it: median absolute error "
              f"{memory['median_abs_error']:.1%}, {memory['predicted_to_fit']} predicted to fit")
    assumed = [r for r in rows if any("unknown" in a for a in r["assumed"])]
    for r in assumed:
        print(f"  runtime assumed for {r['id']}: {r['assumed'][0]}")
    print(f"with the practitioner set and the sweeps: {len(every)} runs, MAPE {mape(every):.1%}, "
          f"{len(unfit)} of them predicted not to fit")
    for r in unfit:
        print(f"  ran, but predicted not to fit: {r['id']} ({r['reason']})")
    print(f"\nnot scored: {len(skipped)} runs")
    for s in skipped:
        print(f"  {s['id']:38} {s['reason']}")
        if s["predicted"]:
            priced = ", ".join(f"{p['step_s']:.2f} s under {policy}"
                               + ("" if p["feasible"] else " (predicted not to fit)")
                               for policy, p in s["predicted"].items())
            measured = "-" if s["measured_s"] is None else f"{s['measured_s']:.2f} s"
            print(f"  {'':38} measured {measured}; predicted as {s['runtime']}, "
                  f"not scored: {priced}")


def print_loso(loso: dict) -> None:
    print(f"\n{'leave one source (publication) out':40} {'runs':>4} {'MAPE':>6} {'in band':>9} "
          f"{'band':>6}  from the other sources")
    for src, v in loso.items():
        line = f"{src[:40]:40} {v['runs']:>4} {v['mape']:>6.1%} {v['inside_band']:>4}/{v['runs']:<4}"
        for t in v["bands"]:
            origin = t["origin"] or "default: no group or family of theirs has 3 runs"
            if len(v["bands"]) > 1:  # one line per band under the source's total
                print(line.rstrip())
                line = f"{'':52} {t['inside']:>4}/{t['runs']:<4}"
            line = f"{line} {t['band']:>6.1%}  {origin}"
        print(line)
    for name, (inside, tested) in coverage(loso).items():
        what = "a band of residuals" if name == "residual" else "the default band"
        print(f"in band, tested against {what}: {inside}/{tested}"
              + (f" ({inside / tested:.0%})" if tested else ""))


def print_picks(picks: list[dict]) -> None:
    print(f"\n{'group (one model, one cluster; per token)':56} {'runs':>4} {'fit':>3} "
          f"{'rank':>5}  {'regret':>7}  picked among those predicted to fit")
    for g in picks:
        rho = "-" if g.get("spearman") is None else f"{g['spearman']:.2f}"
        head = f"{g['group'][:56]:56} {g['runs']:>4} {g['feasible']:>3} {rho:>5}"
        if g["picked"] is None:
            print(f"{head}  {'-':>7}  none predicted to fit (fastest {g['fastest']})")
            continue
        other = "" if g["picked"] == g["fastest"] else f" (fastest {g['fastest']})"
        print(f"{head}  {g['regret']:>+7.1%}  {g['picked']}{other}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--no-practitioner", action="store_true",
                    help="leave out benchmarks/data/practitioner.yaml and the sweeps")
    ap.add_argument("--write-bands", action="store_true",
                    help=f"write the error bands to {BANDS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        sys.stderr.write(f"published_accuracy: no data file at {args.data}; pass --data PATH\n")
        return 2
    try:
        rows, skipped = read(args.data)
    except (ConfigError, yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        where = "" if isinstance(err, ConfigError) else f"{args.data}: "  # it names the file
        sys.stderr.write(f"published_accuracy: {where}{' '.join(str(err).split())}\n")
        return 2
    every = rows + ([] if args.no_practitioner else practitioner_rows())
    loso, picks = leave_one_source_out(every), first_choice(every)
    if args.write_bands:
        write_bands(every, BANDS, [] if args.no_practitioner else fp8_rows())
    if args.format == "json":
        print(json.dumps({"runs": rows, "mape": mape(rows), "memory": memory_summary(rows),
                          "not_scored": skipped,
                          "all_runs": every, "leave_one_source_out": loso,
                          "first_choice": picks}, indent=2))
        return 0
    print_runs(rows, skipped, every, args.data)
    print_loso(loso)
    print_picks(picks)
    if args.write_bands:
        print(f"\nwrote {BANDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
