"""The terminal view of a search, in order: the header line, the ranked table (table.py, rows
from rows.py), each GPU type's best (summary.py), the lines under it (notes.py and baseline.py's
why and note lines), the count of candidates by reason, and the nearest miss when nothing fits.

The default layout fits the terminal (80 columns when there is none): knobs that every shown
plan shares move to one line above the table, cells are abbreviated, equivalent plans share
a row and less important columns are left out, never the objective's. `--wide` prints every
column in full.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console

from autoplan.display import count, terminal_width
from autoplan.search.engine import SearchResult
from autoplan.search.notes import (
    cost_line,
    fold_note,
    fp8_line,
    other_precision_line,
    p75_line,
)
from autoplan.search.rows import shown_rows
from autoplan.search.table import COLUMNS, counts_table, legend, ranked_table


def render(console: Console, result: SearchResult, data: dict[str, Any], top: int,
           wide: bool = False) -> None:
    width = terminal_width()
    console.width = max(width, 80)
    gpus, batches = data["num_gpus"], data.get("global_batch_range")
    console.print(header(data, result.request.model.seq_len))
    if data["top"]:
        shown = shown_rows(result, data, top)
        merged = any(len(s.zeros) > 1 or len(s.splits) > 1 or len(s.optimizers) > 1
                     for s in shown)
        title = table_title(data, result.request.targets.multi, merged, len(shown))
        table, shared, dropped = ranked_table(shown, title, data["objectives"], wide, width,
                                              len(gpus) == 1, not batches)
        if wide:
            console.width = max(width, Console(width=10_000).measure(table).maximum)
        if shared:
            console.print("every plan below: " + ", ".join(shared), markup=False)
        console.print(table)
        line = legend(shown, wide, {str(c.header) for c in table.columns})
        if dropped:
            names = {c[0]: c[1] for c in COLUMNS}
            line += f"{'; ' if line else ''}--wide adds: {', '.join(names[d] for d in dropped)}"
        if line:
            console.print(line, markup=False, style="dim")
        type_lines(console, data)  # beside the ranking they summarise (user test 38)
        from autoplan.search.baseline import note_lines, why_lines

        headers = {str(c.header) for c in table.columns}
        lines = [*why_lines(result, data, shown), other_precision_line(data), fp8_line(data),
                 *note_lines(result, shown), p75_line(data, shown),
                 # the cost columns say the cost, but a narrow table may drop the days
                 None if headers & {"GPU-h", "USD"} and "days" in headers
                 else cost_line(data, shown),
                 fold_note(result, shown, len(data["top"]), top)]
        for why in lines:
            if why:
                console.print(why, markup=False)
    console.print(counts_table(data["counts"], data["candidates"]))
    near = data.get("nearest")
    if near:
        p = near["plan"]
        # one line however narrow the terminal: the assignments are pasted into a shell
        console.print(f"[red]no feasible plan.[/] nearest{miss_where(data, p)} (as estimate "
                      f"--set): {miss_knobs(p)}, which", soft_wrap=True)
        for m in near["misses"]:
            console.print(f"  - {m}", markup=False)
        hint = more_gpus_text(near)
        if hint:
            console.print(hint, markup=False)
    if not data["top"]:  # each type's nearest miss, after the search's own
        type_lines(console, data)


def type_lines(console: Console, data: dict[str, Any]) -> None:
    """The "best per GPU type" lines of a multi-type search (summary.by_cluster_lines), one
    line each, for grep."""
    from autoplan.search.summary import by_cluster_lines

    for line in by_cluster_lines(data.get("by_cluster") or [], data["objectives"]):
        console.print(line, markup=False, soft_wrap=True)


def header(data: dict[str, Any], seq_len: int) -> str:
    """The first line (rich markup): the model on the GPUs, the global batch, the space, the
    runtime priced for and what was scored."""
    where = counts_text(data["num_gpus"], data.get("num_gpus_range"))
    return (f"[bold]{data['model']}[/] on {where} x {data['cluster']}, global batch "
            f"{batch_text(data, seq_len)}, space {data['space']}, priced for runtime "
            f"{data['runtime']}: {searched_text(data)}, "
            f"{data['scored']:,} scored, {data['feasible_count']:,} feasible{kept_text(data)} "
            f"in {data['seconds']:.2f} s{more_trials_text(data)}")


def searched_text(data: dict[str, Any]) -> str:
    """"exhaustive search, 1,404 candidates"; a sampled search says the space it drew from
    (sampled.sampled_text) and counts trials: "tpe search (the space's 6,992,568 candidates
    exceed max_enumerate 5,000,000): 300 trials"."""
    spaces = data.get("sampled_space") or []
    if not spaces:
        return f"{data['sampler']} search, {data['candidates']:,} candidates"
    from autoplan.search.sampled import sampled_text

    what = "candidates and trials" if "exhaustive" in data["sampler"] else "trials"
    return (f"{data['sampler']} search ({sampled_text(spaces, ',' in data['cluster'])}): "
            f"{data['candidates']:,} {what}")


def more_trials_text(data: dict[str, Any]) -> str:
    """"; --trials above 300 samples more" after a sampled search's header, else ""."""
    if not data.get("sampled_space") or "trials" not in data:
        return ""
    return f"; --trials above {data['trials']:,} samples more"


def batch_text(data: dict[str, Any], seq_len: int) -> str:
    """The global batch in sequences and the tokens a step they make at `seq_len` (the model's
    as the search priced it): "1536 (3.15M tokens)", a range "1024..4096 (4.19M..16.8M
    tokens)"."""
    sizes = data.get("global_batch_range") or [data["global_batch_size"]]
    return (f"{'..'.join(map(str, sizes))} "
            f"({'..'.join(count(n * seq_len) for n in sizes)} tokens)")


def kept_text(data: dict[str, Any]) -> str:
    """" (36,000 kept: ...)" when a GPU-count range kept only some of the scored rows (the
    ones ranked and written to trials.csv.gz); empty when every scored row was kept."""
    from autoplan.search.engine import KEEP_PER_COUNT

    kept = data.get("kept", data["scored"])
    if kept >= data["scored"]:
        return ""
    return (f" ({kept:,} kept: the best {KEEP_PER_COUNT:,} per GPU count and its "
            f"{KEEP_PER_COUNT:,} nearest misses)")


LISTED_COUNTS = 12
"""GPU counts a header writes out before it shortens the list to its first and last."""


def counts_text(gpus: list[int], typed_range: Any = None) -> str:
    """The GPU counts as the user asked: a list as the list ("8, 16 or 32": not "8..32",
    which reads as every count between), a range of more than four counts as the range it
    searched ("64..1024 (12 counts)"); a list past LISTED_COUNTS shortened with "..."."""
    n = len(gpus)
    if n == 1:
        return f"{gpus[0]}"
    if typed_range and n > 4:
        return f"{gpus[0]}..{gpus[-1]} ({n} counts)"
    if n > LISTED_COUNTS:
        return f"{', '.join(map(str, gpus[:LISTED_COUNTS - 2]))}, ..., {gpus[-1]} ({n} counts)"
    return f"{', '.join(map(str, gpus[:-1]))} or {gpus[-1]}"


def plans_text(n: int) -> str:
    return f"{n} plan{'' if n == 1 else 's'}"


def table_title(data: dict[str, Any], multi: bool, merged: bool,
                rows: int | None = None) -> str:
    """"Pareto front (5 plans; throughput vs cost)" or "top 10 plans by throughput"; "top 10
    plans by throughput, in 5 rows (...)" where `rows` of the table hold them: what `#`
    numbers is each row's first plan's rank (top.yaml's order), so it skips the others (the
    ones merged, and the recompute variants notes.fold_line names)."""
    if multi:
        return f"Pareto front ({plans_text(data['pareto_size'])}; {' vs '.join(data['objectives'])})"
    plans = len(data["top"])
    return (f"top {plans_text(plans)} by {data['objectives'][0]}"
            + (f", in {rows} row{'' if rows == 1 else 's'}" if rows and rows < plans else "")
            + (" (equivalent plans share a row)" if merged else ""))


def more_gpus_text(near: dict[str, Any], short: bool = False) -> str:
    """"to find the fewest GPUs that fit: try --num-gpus 4..64 --objective gpus (...)" for a
    nearest miss that more GPUs may cure (nearest.more_gpus), else ""; `short`: without the
    parenthesis on how far the nearest misses."""
    more = near.get("more_gpus")
    if not more:
        return ""
    what = "fit" if near.get("reason") in ("out-of-memory", "host-memory") else "meet the targets"
    text = f"to find the fewest GPUs that {what}: try --num-gpus {more['num_gpus']} --objective gpus"
    if short:
        return text
    return (f"{text} (the nearest, on {more['from']} GPUs, misses by "
            f"{1 + more['short']:.3g}x: {math.ceil(more['proportional']):,} GPUs if that "
            "shrank in proportion)")


def miss_where(data: dict[str, Any], p: dict[str, Any]) -> str:
    """' on N x PROFILE' where the search had several GPU types or counts (estimate takes
    one of each), else ''."""
    if "," in data.get("cluster", "") or len(data.get("num_gpus") or ()) > 1:
        return f" on {p['cluster']['num_gpus']} x {p['cluster']['profile']}"
    return ""


def miss_knobs(p: dict[str, Any]) -> str:
    """A plan (plan_to_dict's) as `estimate --set` assignments, so `estimate --model M
    --cluster C --num-gpus N --global-batch-size G --set ...` with them prices the same figure:
    the parallel degrees, the batch, the precision and the attention always (estimate's
    default precision is the device's, not a plan's bf16, and its default attention the one the
    runtime runs on the device: eager under Megatron on a V100), then every other field the
    plan sets away from a plan's default (ZeRO stage, offload, recompute, sequence parallelism,
    pipeline schedule and vpp, gradient reduce dtype)."""
    import shlex

    from autoplan.plan import Batch, Plan, plan_from_dict
    from autoplan.plan_files import plan_to_dict

    plan = plan_from_dict(dict(p))
    default = plan_to_dict(Plan(model=plan.model, cluster=plan.cluster,
                                batch=Batch(micro_batch_size=1, global_batch_size=1)))
    given = flat_fields(plan_to_dict(plan))
    default_fields = flat_fields(default)
    always = [k for k in given if k.startswith("parallel.")] + [
        "batch.micro_batch_size", "batch.global_batch_size", "precision", "attention"]
    rest = [k for k in given if k not in always
            and not k.startswith(("model", "cluster.", "predicted", "schema_version"))
            and given[k] != default_fields.get(k)]
    return " ".join(shlex.quote(f"{k}={set_value(given[k])}") for k in [*always, *rest])


def flat_fields(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A plan mapping's leaves by dotted key (`pipeline.vpp`), as `--set` names them."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("model", "predicted"):
            out |= flat_fields(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def set_value(value: Any) -> str:
    """A field's value as `--set` reads it (YAML): true/false, null, [a,b], or the text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(set_value(v) for v in value) + "]"
    return str(value)
