"""What a search says besides its table: the summary fields cli.py adds (studies, by_cluster,
the caveats under the table), the lines they print (resumed studies, best per GPU type) and the
one line of an exit 3. The table and the lines under it are render.py's and notes.py's."""

from __future__ import annotations

from typing import Any

from autoplan.display import days, sig
from autoplan.search.engine import SearchResult
from autoplan.search.notes import money_or_hours_text


def study_counts(result: SearchResult) -> list[dict[str, Any]]:
    """summary `studies` (with --storage): per study, the complete trials it held when this
    search opened it (`stored`), those this process added (`new`), those it holds at the end
    (`held`: more than stored + new where other workers share it) and --trials, the total a
    study is sampled up to (`trials`). Counted by the search on the study it opened: a
    read-only look at an SQLite file another worker writes can fail, which left a worker's
    summary without `studies` (user test 36)."""
    return [{"study": s.study, "stored": s.stored, "new": s.new, "held": s.held,
             "trials": result.request.trials} for s in result.studies]


def resumed_lines(studies: list[dict[str, Any]]) -> list[str]:
    """What a search that resumed a stored study, or shared one with other workers, did: the
    trials it found, those it added, those other workers added, and that --trials counts the
    study's total (rerun with the same --trials, it adds none)."""
    lines = []
    for s in studies:
        others = s.get("held", s["stored"] + s["new"]) - s["stored"] - s["new"]
        if not s["stored"] and others <= 0:
            continue  # a new study of one worker: the header line's count is all its trials
        head = (f"resumed study {s['study']}: {s['stored']:,} trials stored, " if s["stored"]
                else f"study {s['study']}: ")
        total = f"--trials {s['trials']:,} is the study's total"
        if others > 0:
            over = s["held"] - s["trials"]
            past = (f"; workers sharing a study each finish the trial they have in flight, so "
                    f"it holds {over:,} more" if over > 0 else "")
            new = f"{s['new']:,} new" if s["new"] else "none new"
            lines.append(f"{head}{new} by this worker, {others:,} by others sharing it: it "
                         f"holds {s['held']:,} ({total}{past})")
        elif s["new"]:
            lines.append(f"{head}{s['new']:,} new ({total})")
        else:
            lines.append(f"{head}none new ({total}): raise --trials above {s['stored']:,} to "
                         "sample more")
    return lines



def caveats(result: SearchResult, data: dict[str, Any]) -> dict[str, Any]:
    """What the table says under its rows, as summary fields: `p75_alternative` (plan #1 is
    tight), `other_precision` (#1's band or lean is wider than its margin over another
    precision) and, when nothing is feasible, `nearest.more_gpus` (a --num-gpus range)."""
    from autoplan.search.nearest import more_gpus
    from autoplan.search.notes import other_precision, p75_alternative

    out: dict[str, Any] = {}
    for key, value in (("p75_alternative", p75_alternative(result)),
                       ("other_precision", other_precision(result))):
        if value is not None:
            out[key] = value
    more = more_gpus(result.request, result.scored, result.miss) if result.miss else None
    if more is not None and data.get("nearest"):
        out["nearest"] = data["nearest"] | {"more_gpus": more}
    return out


def infeasible_line(data: dict[str, Any]) -> str:
    """One line: the candidates by reason, then the nearest miss (render.miss_knobs) and what
    it misses."""
    counts = ", ".join(f"{k} {v:,}" for k, v in data["counts"].items() if k != "feasible")
    line = f"no feasible plan among {data['candidates']:,} candidates ({counts})"
    near = data.get("nearest")
    if near:
        p = near["plan"]
        from autoplan.search.render import miss_knobs, miss_where

        # every field away from the default, so `estimate --set` with them prices the figure
        where = ("" if p is None else
                 f"{miss_where(data, p)} (as estimate --set) {miss_knobs(p)}")
        misses = list(near["misses"])
        # a multi-type miss leads with its GPU type, which `where` has named already
        said = "" if p is None else miss_where(data, p).strip() + ", "
        if misses and said != ", " and misses[0].startswith(said):
            misses[0] = misses[0][len(said):]
        line += f"; nearest ({near['reason']}){where}: {'; '.join(misses)}"
        from autoplan.search.render import more_gpus_text

        hint = more_gpus_text(near)
        if hint:
            line += f"; {hint}"
    return line


def table_infeasible_line(data: dict[str, Any]) -> str:
    """The stderr line of a table search that found nothing, where the table on stdout has
    shown the nearest miss already (user test 37: the whole text twice, on stdout and on
    stderr), with the --num-gpus range to search next, short: with `--format table > FILE`
    stderr is all the terminal shows."""
    from autoplan.search.render import more_gpus_text

    near = data.get("nearest") or {}
    if near.get("plan") is None:
        return infeasible_line(data)
    line = f"no feasible plan among {data['candidates']:,} candidates; the nearest miss "
    hint = more_gpus_text(near, short=True)
    if not hint:
        return f"{line}({near['reason']}) and what to try are on stdout"
    return f"{line}({near['reason']}) is on stdout; {hint}"


def best_by_cluster(result: SearchResult) -> list[dict[str, Any]]:
    """The best plan of each GPU type by the (first) objective, then the best overall, with its
    precision and error band and the figures of every objective: tokens/s, step seconds, and
    with --train-tokens or a cost objective GPU-hours and dollars (for `cost_tokens`: the
    budget, else 1e9 tokens)."""
    import numpy as np

    sc, req = result.scored, result.request
    c, t = sc.cols, req.targets
    out: list[dict[str, Any]] = []
    where = c.get("cluster", np.zeros(sc.n, dtype=np.int64))
    picks = [(name, next((int(i) for i in result.order if where[i] == k), None))
             for k, name in enumerate(sc.clusters)]
    picks.append(("overall", result.best))
    for k, (name, i) in enumerate(picks):
        row: dict[str, Any] = {"cluster": name if i is None else sc.clusters[int(where[i])],
                               "which": name, "feasible": i is not None}
        miss = result.type_misses.get(name) if k < len(sc.clusters) else None
        if i is None and miss is not None:  # why, as a search of this type alone says it
            row["nearest"] = {"reason": miss.reason, "misses": list(miss.misses)}
        if i is not None:
            tps = float(c["tokens_per_s"][i])
            row |= {"num_gpus": int(c["num_gpus"][i]), "tokens_per_s": tps,
                    "step_s": float(c["time_step"][i]),
                    "parallel": {k: int(c[k][i]) for k in ("dp", "tp", "pp", "cp")},
                    # codes alike across types (engine.shared_precision)
                    "precision": req.space.precision[int(c["precision"][i])].value}
            if "band" in c:  # the step time's error band (cost/error_band.py), as top's
                row["error_band"] = float(c["band"][i])
            if t.train_tokens is not None:
                row["days"] = t.train_tokens / tps / 86400.0
            if t.train_tokens is not None or "cost" in t.objectives:
                hours = float(c["num_gpus"][i]) * t.cost_tokens / tps / 3600.0
                row |= {"gpu_hours": hours, "cost_tokens": t.cost_tokens}
                price = float(c.get("price_per_gpu_hour", np.full(sc.n, np.nan))[i])
                if np.isfinite(price):
                    row |= {"usd": hours * price, "price_per_gpu_hour": price}
        out.append(row)
    return out


def by_cluster_lines(rows: list[dict[str, Any]], objectives: list[str]) -> list[str]:
    """`best per GPU type` lines right under the table of a multi-type search (render.render):
    each plan's layout, precision and error band, then its figure of the first objective first (cost: dollars and GPU-hours, or GPU-hours where unpriced;
    latency: the step time; throughput: tokens/s; gpus: the count, which leads every line)."""
    if not rows:
        return []
    first = objectives[0] if objectives else "throughput"
    which = f"{first}, the first objective" if len(objectives) > 1 else first
    lines = [f"best per GPU type (by {which}):"]
    for r in rows:
        label = "overall" if r["which"] == "overall" else r["cluster"]
        if not r["feasible"]:
            near = r.get("nearest")
            why = f"; nearest ({near['reason']}): {'; '.join(near['misses'])}" if near else ""
            lines.append(f"  {label}: no feasible plan{why}")
            continue
        par = r["parallel"]
        of = f" of {r['cluster']}" if label == "overall" else ""
        lines.append(f"  {label}: {r['num_gpus']} GPUs{of}, dp={par['dp']} tp={par['tp']} "
                     f"pp={par['pp']} cp={par['cp']}, {_precision(r)}"
                     + ", ".join(_figures(r, first)))
    return lines


def _precision(r: dict[str, Any]) -> str:
    """"fp8 (±22%), " from a by_cluster row: an fp8 winner's band is the fp8 runs' own (user
    test 38: the H100's fp8 ±22% showed in the table only); "" where the row has neither."""
    band = r.get("error_band")
    spread = f" (±{band:.0%})" if isinstance(band, float) else ""
    return f"{r['precision']}{spread}, " if "precision" in r else ""


def _figures(r: dict[str, Any], first: str) -> list[str]:
    """A by_cluster row's figures, the first objective's first."""
    rate = [f"{r['tokens_per_s']:,.0f} tokens/s"]
    step = [f"step {sig(r['step_s'])} s"]
    train = [f"{days(r['days'])} days"] if "days" in r else []
    cost = []
    if "gpu_hours" in r:  # for the budget (days shown), else per 1e9 tokens
        budget = f"{r['cost_tokens']:.3g}".replace("e+0", "e").replace("e+", "e")
        per = "" if "days" in r else f" per {budget} tokens"
        hours = f"{money_or_hours_text(r['gpu_hours'])} GPU-h"
        cost = [f"${money_or_hours_text(r['usd'])}{per} ({hours} at ${r['price_per_gpu_hour']:.2f}/GPU-h)"
                if "usd" in r else f"{hours}{per}"]
    if first == "cost":
        return cost + train + rate
    if first == "latency":
        return step + rate + train + cost
    return rate + train + cost
