"""How `autoplan tune` shows its trials: one line per finished trial, the table of trials (the
prediction, the calibrated prediction and the measurement) and each trial's row."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from autoplan.plan import Plan


def trial_printer(console: Any, total: int) -> Any:
    """run_tune's per-trial callback: one line per run, on a terminal or not."""
    finished = [0]
    started = time.monotonic()

    def on_trial(cand: Any, outcome: Any) -> None:
        finished[0] += 1
        measured = f"{outcome.step_time_s:.4g} s" if outcome.step_time_s else "-"
        console.print(f"  [{finished[0]}/{total}, {time.monotonic() - started:.0f} s] "
                      f"{cand.source:14} {short_plan(cand.plan):48} {outcome.status:8} "
                      f"{measured} {outcome.reason}", markup=False)

    return on_trial


def resumed_line(study: str, stored: int, new: int, total: int) -> str:
    """What a tune that resumed a stored study did, in the search's words
    (search.summary.resumed_lines): the trials it found and those it added."""
    line = f"resumed study {study}: {stored:,} trials stored, {f'{new:,}' if new else 'none'} new"
    if not new and stored >= total:
        line += " (every plan has a result: another --study name runs them again)"
    return line


def dry_run_line(total_s: float, budget_s: float, fit: int, to_run: int, stored: int,
                 study: str | None) -> str:
    """The dry run's line under its table: the predicted seconds of the trials left against the
    budget, how many of them fit, and the trials the study already holds (run not again)."""
    line = f"predicted total {total_s:.0f} s of a {budget_s:.0f} s budget"
    if stored:
        line += (f" for the {to_run:,} trials left (study {study} holds {stored:,}, shown with "
                 "their measurements)" if to_run else
                 f": study {study} holds a result for every plan, so the tune runs none")
    if total_s > budget_s:
        line += (f": about {fit} of {to_run} trials fit; tune runs them best predicted "
                 "first and reports the rest as not run (raise --budget-s to run all)")
    return line


def trial_rows(trials: list[dict[str, Any]], by_key: dict[str, Any], calib: Any
                ) -> list[dict[str, Any]]:
    """One row per trial: where its plan came from, the plan, the trial's fields and, once
    calibrated, what the calibrated profile predicts for it (run or not)."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import ClusterSpec

    rows = []
    for t in trials:
        plan = by_key[t["key"]].plan
        row = {"source": by_key[t["key"]].source, "plan": short_plan(plan), **t}
        if calib:
            row["predicted_after_s"] = estimate_plan(
                plan, ClusterSpec(calib.profile, plan.cluster.num_gpus)).step_time_s
        rows.append(row)
    return rows


def short_plan(plan: Plan) -> str:
    p = plan.parallel
    return (f"dp{p.dp} tp{p.tp} pp{p.pp} z{plan.zero_stage} "
            f"{plan.recompute.policy.value} mbs{plan.batch.micro_batch_size}"
            + (" sp" if plan.sequence_parallel else "")
            + (f" {plan.pipeline.schedule.value}" if p.pp > 1 else "")
            + (f" {plan.precision.value}" if plan.precision.value != "bf16" else "")
            + (" eager" if plan.attention.value == "eager" else ""))


TRIAL_COLUMNS = (("source", "source"), ("plan", "plan"), ("status", "status"),
                 ("predicted_step_s", "pred. s"), ("predicted_after_s", "calib. s"),
                 ("measured_step_s", "meas. s"), ("measured_tokens_per_s", "tokens/s"))
"""(row key, header) of the tune's table, short enough for an 80-column terminal with the two
predictions told apart (LEGEND); each trial's reason follows the table."""
LEGEND = {False: "pred. s: the step time the profile predicts; meas. s: the median measured "
                 "step",
          True: "pred. s, calib. s: the step time predicted by the profile, and by the profile "
                "calibrated on these trials; meas. s: the median measured step"}
"""The table's legend, without and with a calibration."""
PARTIAL = "~"
"""Marks a pruned trial's partial figure in the measured columns."""
PARTIAL_OF = {"measured_step_s": "partial_step_s",
              "measured_tokens_per_s": "partial_tokens_per_s"}


def cell(row: dict[str, Any], key: str) -> str:
    """A table cell: seconds to 3 significant figures, tokens/s whole, `-` for no figure, and
    a pruned trial's partial measurement marked with PARTIAL."""
    from autoplan.display import sig, whole

    value, mark = row.get(key), ""
    if value is None and row.get(PARTIAL_OF.get(key, "")) is not None:
        value, mark = row[PARTIAL_OF[key]], PARTIAL
    if value is None:
        return "-" if key.endswith(("_s", "_per_s")) else ""
    if key == "source":
        return str(value).removeprefix("model ")  # "rank 3" or "user"
    if isinstance(value, float):
        return mark + (whole(value) if key.endswith("_per_s") else sig(value))
    return str(value)


def trial_table(rows: list[dict[str, Any]], cols: tuple[tuple[str, str], ...],
                title: str) -> Table:
    """The rows under `cols` (those no row has a figure for left out); only the plan wraps."""
    cols = tuple((key, header) for key, header in cols
                 if any(r.get(key) is not None for r in rows))
    t = Table(title=title)
    for key, header in cols:
        t.add_column(header, justify="right" if key.endswith("_s") else "left",
                     no_wrap=key != "plan", min_width=len(header))
    for r in rows:
        t.add_row(*[cell(r, key) for key, _ in cols])
    return t
