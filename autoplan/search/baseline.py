"""Why the winner wins: what it gains against the next different layout in the ranking and
against the published recipe for the model (`baselines.yaml`), scored with the same cost model
on the winner's GPU type, GPU count and global batch. The cost model's error band, where it
reports one, says whether the gain is larger than the model's own error."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import yaml

from autoplan.display import sig
from autoplan.search.engine import SearchRequest, SearchResult, type_requests

log = logging.getLogger(__name__)
LAYOUT = ("num_gpus", "dp", "tp", "pp", "cp")
"""The knobs that make two plans different layouts for the "why" line."""


@dataclass(frozen=True)
class BaselineScore:
    """A published recipe scored at the user's GPU count and batch."""

    name: str
    source: str
    layout: str
    feasible: bool
    reasons: tuple[str, ...]
    step_s: float
    tokens_per_s: float
    mfu: float
    band: float | None


def load_baselines() -> list[dict[str, Any]]:
    text = resources.files("autoplan.search").joinpath("baselines.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    return list(data["baselines"])


def recipe_for(model_name: str) -> dict[str, Any] | None:
    return next((b for b in load_baselines() if model_name in b["models"]), None)


def score_baseline(result: SearchResult, num_gpus: int, global_batch_size: int | None = None,
                   cluster: str | None = None, precision: str | None = None
                   ) -> BaselineScore | None:
    """The model's published recipe as a plan at `num_gpus` (dp refilled) and
    `global_batch_size` (default: the request's) on the GPU type `cluster` names (default: the
    request's first), in `precision` (default: the space's first; the winner's, so that a gain
    over the recipe is the layout's and not FP8's), or None when the model has no recipe or the
    GPU count is not a multiple of the recipe's tp * pp * cp."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import ClusterSpec
    from autoplan.plan import plan_from_dict
    from autoplan.search.partition import balanced_layers

    req = type_request(result.request, cluster)
    recipe = recipe_for(req.model.name)
    if recipe is None:
        return None
    par = dict(recipe["parallel"])
    model_parallel = par["tp"] * par["pp"] * par["cp"]
    if num_gpus % model_parallel:
        return None
    par["dp"] = num_gpus // model_parallel
    pipeline = dict(recipe["pipeline"])
    if recipe.get("split") == "balanced":
        layers = balanced_layers(req.model, par["pp"] * pipeline["vpp"])
        if layers is not None:
            pipeline["layers_per_stage"] = list(layers)
    model_ref = req.model_ref if isinstance(req.model_ref, str) else req.model.name
    plan = plan_from_dict({
        "model": model_ref, "cluster": {"profile": req.profile_ref, "num_gpus": num_gpus},
        "parallel": par, "sequence_parallel": recipe["sequence_parallel"], "pipeline": pipeline,
        "zero_stage": recipe["zero_stage"], "recompute": {"policy": recipe["recompute"]},
        "batch": {"micro_batch_size": recipe["micro_batch_size"],
                  "global_batch_size": global_batch_size or req.global_batch_size},
        "precision": precision or req.space.precision[0].value,
    })
    # priced under the runtime the search priced its plans with, so the gain compares like
    est = estimate_plan(plan, ClusterSpec(req.profile, num_gpus), req.model, runtime=req.runtime)
    band = getattr(est, "error_band", None)
    layout = (f"dp{par['dp']} tp{par['tp']} pp{par['pp']}" + (f" cp{par['cp']}" if par["cp"] > 1
              else "") + (" sp" if recipe["sequence_parallel"] else "")
              + (f" {pipeline['schedule']} v{pipeline['vpp']}" if pipeline["vpp"] > 1 else "")
              + f" {recipe['recompute']} mbs{recipe['micro_batch_size']} {plan.precision.value}")
    feasible, reasons = est.feasible, tuple(est.reasons)
    if feasible and req.targets.memory_slack == "p75" and est.memory["tight_by"] > 0:
        # held to the slack the search held its own plans to (--memory-slack p75)
        reasons = (f"needs {est.memory['tight_by'] / 2**30:.1f} GiB per GPU more than the "
                   f"{est.memory['capacity'] / 2**30:.1f} GiB at the allocator's "
                   "75th-percentile slack",)
        feasible = False
    return BaselineScore(recipe["name"], " ".join(recipe["source"].split()), layout,
                         feasible, reasons, est.time["step"], est.tokens_per_s,
                         est.mfu, float(band) if isinstance(band, (int, float)) else None)


def type_request(req: SearchRequest, cluster: str | None) -> SearchRequest:
    """The request of one GPU type of a multi-type search (its profile, and its space settled
    for that device), or `req` itself when it has one type or `cluster` names none of them."""
    return next((sub for sub in type_requests(req) if sub.profile_ref == cluster), req) \
        if req.types and cluster else req


def layout_text(r: dict[str, Any]) -> str:
    return " ".join(f"{k}{r[k]}" for k in ("dp", "tp", "pp", "cp") if k != "cp" or r[k] > 1)


def gain_text(best: float, other: float, band: float | None, cpu: bool = False) -> str:
    """"+4.2% tokens/s", with a note when the gain is inside the error band: measure both with
    `autoplan tune`, which measures the machine it runs on (on the GPUs priced; a CPU
    profile's host is this one)."""
    gain = best / other - 1.0
    text = f"{gain:+.1%} tokens/s"
    if band is not None:
        where = "on this machine" if cpu else "on those GPUs"
        text += (f", inside the cost model's ±{band:.0%} band: measure both (autoplan tune, "
                 f"{where})" if abs(gain) < band
                 else f", more than the cost model's ±{band:.0%} band")
    return text


def verdict(reasons: tuple[str, ...]) -> str:
    """Why a recipe is out, in two words: memory is the one reason it "does not fit"; a plan
    or runtime rule (fp8 with tp under autoplan's own runtime) means it "cannot run" here."""
    memory = any(r.startswith(("needs ", "offloaded states need")) for r in reasons)
    return "does not fit" if memory else "cannot run"


def why_lines(result: SearchResult, data: dict[str, Any], shown: list[Any]) -> list[str]:
    """The "why this plan" lines under the ranked table: what the winner gains against the next
    different layout and the published recipe (a single throughput or latency objective)."""
    return gain_lines(result, shown) if shown else []


def note_lines(result: SearchResult, shown: list[Any]) -> list[str]:
    """Notes on the first plan shown, under any objective: its predicted MFU above what the
    validated runs of its kind on its GPU were predicted at, and the runtime's export target
    refusing it."""
    from autoplan.search.exportable import export_line

    if not shown:
        return []
    lines = [unvalidated_line(result, shown[0].row), export_line(result)]
    return [line for line in lines if line]


def unvalidated_line(result: SearchResult, best: dict[str, Any]) -> str | None:
    """"unvalidated: the winner's MFU 64.3% is above the 22 validated megatron runs ..." where
    the row lies above its MFU ceiling (ranking.frame's above_validated; error_band.
    mfu_ceiling), else None; "plan #1's" where several objectives rank the plans. The ranking
    is the cost model's as it stands: nothing caps a row's MFU."""
    from autoplan.cost.error_band import kind_of, mfu_ceiling
    from autoplan.cost.estimate import default_runtime
    from autoplan.display import unvalidated_words

    if not best.get("above_validated"):
        return None
    req = result.request
    profile = next((t.profile for t in req.types if t.ref == best.get("cluster")), req.profile)
    traits = req.runtime or default_runtime(profile)
    kind = int(kind_of(int(best["tp"]), int(best["pp"]), int(best["cp"]),
                       req.model.moe is not None))
    ceiling = mfu_ceiling(traits.base or traits.name, kind, profile, str(best["precision"]),
                          req.model.seq_len)
    if ceiling is None:
        return None
    whose = "plan #1's" if req.targets.multi else "the winner's"
    return f"unvalidated: {whose} " + unvalidated_words(float(best["mfu"]), ceiling,
                                                       profile.is_cpu)


def gain_lines(result: SearchResult, shown: list[Any]) -> list[str]:
    """Why the winner wins, against the next different layout and the published recipe
    (single throughput or latency objective only; `shown` not empty)."""
    objectives = result.request.targets.objectives
    if result.request.targets.multi or objectives[0] not in ("throughput", "latency"):
        return []  # gains in tokens/s explain a throughput ranking, not a GPU-count one
    best = shown[0].row
    band = best.get("band") if isinstance(best.get("band"), float) else None
    cpu = type_request(result.request, best.get("cluster") or None).profile.is_cpu
    lines = [next_layout_line(result, best, band, cpu)]
    try:
        # priced as the winner runs: its GPU type, GPU count and (from a range) global batch
        base = score_baseline(result, int(best["num_gpus"]), int(best["gbs"]) if "gbs" in best
                              else None, best.get("cluster") or None,
                              str(best["precision"]) if best.get("precision") else None)
    except Exception as exc:  # a recipe the plan loader rejects is not the user's mistake
        log.warning("baseline not scored: %s", exc)
        base = None
    if base is not None:
        here = where_text(result.request, best)
        if base.feasible:
            lines.append(f"against the {base.name}, {base.layout}, which scores step "
                         f"{sig(base.step_s)} s, MFU {base.mfu:.1%} {here}: "
                         f"{gain_text(best['tokens_per_s'], base.tokens_per_s, band, cpu)}")
        else:
            lines.append(f"the {base.name} ({base.layout}) {verdict(base.reasons)} {here}: "
                         f"{'; '.join(base.reasons[:2])}")
    return lines


def next_layout(result: SearchResult) -> tuple[int, int] | None:
    """(rank from 1, scored row) of the best-ranked feasible plan whose layout (LAYOUT) differs
    from the winner's, among every ranked plan rather than the --top shown (a GPU-count range
    scored count by count ranks the rows it kept); None when every feasible plan shares the
    winner's layout."""
    order, c = result.order, result.scored.cols
    if not len(order):
        return None
    differs = np.zeros(len(order), dtype=bool)
    for k in LAYOUT:
        differs |= c[k][order] != c[k][order[0]]
    at = np.flatnonzero(differs)
    return (int(at[0]) + 1, int(order[at[0]])) if len(at) else None


def next_layout_line(result: SearchResult, best: dict[str, Any], band: float | None,
                     cpu: bool = False) -> str:
    """The winner against the next different layout in the whole ranking, or the truth that
    every feasible plan shares its layout."""
    found = next_layout(result)
    if found is None:
        plans = len(result.order)
        return (f"why this plan: the only feasible layout found ({layout_text(best)}"
                + (f"; its {plans:,} feasible plans differ in the other knobs)" if plans > 1
                   else ")"))
    rank, i = found
    c = result.scored.cols
    other = {k: int(c[k][i]) for k in ("dp", "tp", "pp", "cp")}
    step, tokens = float(c["time_step"][i]), float(c["tokens_per_s"][i])
    return (f"why this plan: against the next different layout (#{rank}, "
            f"{layout_text(other)}, step {sig(step)} s) "
            f"{gain_text(best['tokens_per_s'], tokens, band, cpu)}")


def where_text(req: SearchRequest, best: dict[str, Any]) -> str:
    """Where the recipe was priced: "here", or the winner's GPU type and global batch when
    the search chose among several."""
    parts = []
    if len(req.types) > 1 and best.get("cluster"):
        parts.append(f"on {best['cluster']}")
    if req.global_batch_size_max not in (None, req.global_batch_size) and "gbs" in best:
        parts.append(f"at global batch {int(best['gbs'])}")
    return " ".join(parts) or "here"
