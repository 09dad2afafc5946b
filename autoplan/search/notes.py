"""The lines under the search table: the recompute variants folded into a row, a --train-tokens
budget's cost, a tight winner's p75 alternative and an fp8 winner's other precision, with the
summary figures (p75_alternative, other_precision) those lines read."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoplan.display import days, sig, whole
from autoplan.search.engine import SearchResult
from autoplan.search.rows import LAYOUT, Shown, collapse, with_band


def ranks_text(ranks: list[int]) -> str:
    """Ranks as "#2-5, #7"."""
    runs: list[list[int]] = []
    for k in sorted(ranks):
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(f"#{r[0]}-{r[-1]}" if len(r) > 1 else f"#{r[0]}" for r in runs)


def fold_line(shown: list[Shown], more: int | None, top: int) -> str | None:
    """What the rows fold (collapse's `fold`) and the --top that shows `top` rows."""
    parts = [f"{ranks_text([k for k, _ in s.folded])} = #{s.rank} with recompute "
             f"{', '.join(dict.fromkeys(cell for _, cell in s.folded))}"
             for s in shown if s.folded]
    if not parts and more is None:
        return None
    text = ("slower recompute variants share their plan's row (it fits without them; top.yaml "
            f"lists them): {'; '.join(parts)}") if parts else ""
    if more is not None:  # the --top whose table holds `top` rows
        text += f"{' ' if text else ''}(--top {more} fills the table's {top} rows)"
    return text


def fold_note(result: SearchResult, shown: list[Shown], plans: int, top: int) -> str | None:
    """fold_line for a table whose `shown` rows hold `plans` ranked plans, with the --top that
    fills `top` rows where the rows hold fewer (not for a Pareto front): the terminal's table
    and report.html's say the same."""
    more = None
    if len(shown) < plans and len(result.order) > plans and not result.request.targets.multi:
        more = top_for_rows(result, top)
    return fold_line(shown, more, top)


def top_for_rows(result: SearchResult, want: int) -> int | None:
    """The --top whose table holds `want` rows (shown_rows), or None where the ranking has too
    few plans for them (or they lie past 50 plans a row)."""
    from autoplan.search.nearest import row_capacities
    from autoplan.search.ranking import frame

    req, sc = result.request, result.scored
    rows = result.order[:50 * want]
    records = frame(sc, rows, req.space, req.targets, result.front,
                    row_capacities(req, sc)).to_dict(orient="records")
    shown = collapse([with_band(r) for r in records], want, fold=True)
    return shown[-1].rank if len(shown) == want and len(rows) > 0 else None


def money_or_hours_text(value: float) -> str:
    """Dollars or GPU-hours as the lines under the table write them: whole from 100 on, else 3
    significant figures ($0.734, not $1). Not cli_common.amount, which reads a number flag."""
    return whole(value) if abs(value) >= 100 else sig(value)


def tokens_text(tokens: float) -> str:
    """A token budget as people write it: 1e12, 3e11, 2.5e12."""
    return f"{tokens:.3g}".replace("e+0", "e").replace("e+", "e")


def cost_line(data: dict[str, Any], shown: list[Shown]) -> str | None:
    """With --train-tokens and no cost column: the days the first plan takes (user test 38: the
    narrow table drops its days column, the figure a deadline wants), what it costs, at which
    price per GPU-hour, and the flag that changes it (its summary row's days, gpu_hours, usd)."""
    tokens = (data.get("targets") or {}).get("train_tokens")
    row = shown[0].row if shown else {}
    hours = row.get("gpu_hours")
    if tokens is None or data.get("by_cluster") or not isinstance(hours, (int, float)) \
            or not math.isfinite(hours) or hours <= 0:
        return None
    usd, where = row.get("usd"), data["cluster"]
    if isinstance(usd, (int, float)) and math.isfinite(usd):
        price = (f"${money_or_hours_text(usd)} at ${usd / hours:.2f}/GPU-h (--price {where}=USD to "
                 "change)")
    else:
        price = f"no price ({where} has no price_per_gpu_hour; --price {where}=USD sets one)"
    span = row.get("days")  # the table's narrow layout leaves its days column out
    took = (f"{days(span)} days at the priced step, " if isinstance(span, (int, float))
            and math.isfinite(span) else "")
    return (f"#{shown[0].rank} for {tokens_text(float(tokens))} tokens: {took}"
            f"{money_or_hours_text(hours)} GPU-hours, {price}")


def p75_alternative(result: SearchResult) -> dict[str, Any] | None:
    """Where plan #1 of a single-objective ranking is tight (fits at the allocator's median
    slack, not at its 75th percentile): the best-ranked plan that fits at both, with its
    change in the objective's figure (`rank` None: no feasible plan does); else None.
    Nothing reorders the ranking: `--memory-slack p75` ranks only such plans."""
    from autoplan.cost.memory import tight_by_bytes
    from autoplan.search.nearest import row_capacities
    from autoplan.search.targets import display_value

    req, sc, order = result.request, result.scored, result.order
    c = sc.cols
    if req.targets.multi or not len(order) or "mem_allocator" not in c:
        return None
    is_tight = tight_by_bytes(c["mem_total"][order], c["mem_allocator"][order],
                              row_capacities(req, sc)[order]) > 0
    if not is_tight[0]:
        return None
    roomy = np.flatnonzero(~is_tight)
    if not len(roomy):
        return {"rank": None}
    j, best = int(roomy[0]), int(order[0])
    i, objective = int(order[j]), req.targets.objectives[0]
    first, other = (display_value(objective, float(c["objectives"][k, 0])) for k in (best, i))
    return {"rank": j + 1, "num_gpus": int(c["num_gpus"][i]),
            "parallel": degrees(c, i),
            "mem_gib": float(c["mem_total"][i]) / 2**30,
            "tokens_per_s": float(c["tokens_per_s"][i]), "step_s": float(c["time_step"][i]),
            "objective": objective, "change": other / first - 1.0}


OBJECTIVE_FIGURES = {"throughput": "tokens/s", "latency": "step time", "cost": "cost",
                     "gpus": "GPUs"}


def p75_line(data: dict[str, Any], shown: list[Shown]) -> str | None:
    """"#1 is tight: the best plan that also fits at the 75th-percentile slack is #3 ..."."""
    alt = data.get("p75_alternative")
    if not alt or not shown:
        return None
    head = f"#{shown[0].rank} is tight (GiB!)"
    if alt["rank"] is None:
        return (f"{head}, and no feasible plan fits at the allocator's 75th-percentile slack: "
                "--memory-slack p75 finds none")
    ranks = {s.rank for s in shown}
    where = "" if alt["rank"] in ranks else \
        f", {layout_text(alt['parallel'])}, {alt['mem_gib']:.1f} GiB, below the table"
    return (f"{head}: the best plan that also fits at the allocator's 75th-percentile slack is "
            f"#{alt['rank']} ({p75_gap_text(alt, shown[0])}{where}); --memory-slack p75 ranks "
            "only those")


def p75_gap_text(alt: dict[str, Any], first: Shown) -> str:
    """What plan #1 gains over the p75 alternative, from #1's side as the why line counts it
    (baseline.gain_text: #1's tokens/s over the other's, less 1), so that both lines print one
    figure for one pair (user test 37: "+0.9%" above "-0.8%" read as a contradiction); under
    --objective cost the cost likewise, under gpus the alternative's GPU count."""
    from autoplan.search.baseline import gain_text

    objective = alt["objective"]
    if objective == "gpus":
        return f"{alt['num_gpus']} GPUs"
    if objective in ("throughput", "latency"):
        gap = gain_text(float(first.row["tokens_per_s"]), float(alt["tokens_per_s"]), None)
    else:  # `change` is the alternative's cost over #1's, less 1
        gap = f"{1.0 / (1.0 + alt['change']) - 1.0:+.1%} {OBJECTIVE_FIGURES[objective]}"
    return f"#{first.rank} against it: {gap}"


def layout_text(par: dict[str, Any]) -> str:
    """"dp16 tp1 pp1", with cp, ep and etp where above 1."""
    return " ".join(f"{k}{par[k]}" for k in ("dp", "tp", "pp", "cp", "ep", "etp")
                    if k in par and (k in ("dp", "tp", "pp") or par[k] > 1))


def degrees(c: dict[str, np.ndarray], i: int) -> dict[str, int]:
    """Row i's parallel degrees, the expert ones too (plan_table.expert_col: 1 when dense)."""
    from autoplan.plan_table import expert_col

    return {**{k: int(c[k][i]) for k in LAYOUT[1:]},
            **{k: int(expert_col(c, k)[i]) for k in ("ep", "etp")}}


def other_precision(result: SearchResult) -> dict[str, Any] | None:
    """Under a throughput or latency ranking, the best plan of another precision class than
    plan #1's where #1's error band or lean is far wider than #1's margin over it: the runs
    behind #1's band took so much longer than priced (error_bias) that, leaned, the order
    flips, or #1's band holds the margin and is at least twice the other's. Else None.
    Nothing adds the lean to a prediction or reorders the ranking: it says "measure both"."""
    from autoplan.cost.error_band import precision_class

    req, sc, order = result.request, result.scored, result.order
    c, t = sc.cols, req.targets
    if t.multi or t.objectives[0] not in ("throughput", "latency") or not len(order) \
            or "band" not in c or "bias" not in c:
        return None
    names = [p.value for p in req.space.precision]
    precision = np.array(names)[np.asarray(c["precision"])[order]]
    classes = np.array([str(precision_class(p)) for p in precision])
    others = np.flatnonzero(classes != classes[0])
    if not len(others):
        return None
    j, best = int(others[0]), int(order[0])
    i = int(order[j])
    band1, band2 = float(c["band"][best]), float(c["band"][i])
    bias1, bias2 = float(c["bias"][best]), float(c["bias"][i])
    if t.objectives[0] == "throughput":
        tokens1, tokens2 = float(c["tokens_per_s"][best]), float(c["tokens_per_s"][i])
        gap, flips = tokens1 / tokens2 - 1.0, tokens1 / (1 + bias1) < tokens2 / (1 + bias2)
    else:
        step1, step2 = float(c["time_step"][best]), float(c["time_step"][i])
        gap, flips = step2 / step1 - 1.0, step1 * (1 + bias1) > step2 * (1 + bias2)
    if not (flips or (band1 > gap and band1 >= 2 * band2)):
        return None
    return {"rank": j + 1, "precision": str(precision[j]),
            "parallel": degrees(c, i),
            "step_s": float(c["time_step"][i]), "tokens_per_s": float(c["tokens_per_s"][i]),
            "error_band": band2, "error_bias": bias2, "slower_as_priced": gap,
            "lean_flips": bool(flips), "winner": {"precision": str(precision[0]),
                                                  "error_band": band1, "error_bias": bias1},
            "moe": req.model.moe is not None}


def other_precision_line(data: dict[str, Any]) -> str | None:
    """"but the best bf16 plan (#4, ...) is 6.0% slower as priced, and #1's ±130% is the error
    of fp8 MoE runs, which took 123% longer than priced on average ...: measure both"."""
    from autoplan.display import bias_words

    o = data.get("other_precision")
    if not o:
        return None
    w = o["winner"]
    moe = " MoE" if o["moe"] else ""
    lean = (f" ({o['precision']}{moe} runs: {o['error_bias']:+.0%})"
            if abs(o["error_bias"]) >= 0.005 else "")
    below = ", below the table" if o["rank"] > len(data.get("top") or ()) else ""
    return (f"but the best {o['precision']} plan (#{o['rank']}{below}, "
            f"{layout_text(o['parallel'])}, "
            f"step {sig(o['step_s'])} s ±{o['error_band']:.0%}) is {o['slower_as_priced']:.1%} "
            f"slower as priced, and #1's ±{w['error_band']:.0%} is the error of "
            f"{w['precision']}{moe} runs{bias_words(w['error_bias'])}{lean}: measure both")


def fp8_line(data: dict[str, Any]) -> str | None:
    """Where plan #1 is fp8 under autoplan's own runtime: it trains through torchao's float8
    layers (runtime/float8.py), a package the install leaves out, on GPUs with fp8 tensor
    cores; said so before the user exports it. None for every other winner."""
    top = data.get("top") or ()
    if not top or str(top[0].get("precision")) != "fp8" \
            or not str(data.get("runtime", "")).startswith("autoplan"):
        return None
    return ("#1 is fp8: `autoplan train` runs it through torchao's float8 layers on GPUs with "
            "fp8 tensor cores (H100 and later), so `pip install torchao` where it trains")
