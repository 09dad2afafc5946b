"""The end-of-run summary: measured medians next to the cost model's prediction for the same
plan, its notes and table, and the run record `autoplan calibrate` reads. Apart from metrics,
which measures and records each step while training; this reads the steps once the run ends.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from autoplan.runtime.metrics import StepMetrics
from autoplan.runtime.summary_notes import band_note, diverged, joined, unmeasured

log = logging.getLogger(__name__)


def predicted(plan: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The cost model's estimate for `plan` (and the runtime it priced, with its error band),
    or (None, why it is missing)."""
    try:
        est_mod = importlib.import_module("autoplan.cost.estimate")
        est = est_mod.estimate_plan(plan)
        return {
            "step_time_s": float(est.step_time_s),
            "tokens_per_s": float(est.tokens_per_s),
            "memory_bytes": float(est.memory_total_bytes),
            "runtime": est.runtime, "error_band": float(est.error_band),
        }, None
    except Exception as err:  # the cost model is optional here: report, never fail training
        return None, f"cost model unavailable ({type(err).__name__}: {err})"


RESUMED_BY = ("--resume", "restart", "elastic")
"""What loaded the checkpoint a run continued from (the summary's resumed_by): the --resume flag,
a torchrun restart after a rank failed, or an --elastic start (a world-size change, or an
elastic job's first launch)."""


def summarize(history: list[StepMetrics], plan: Any, warmup: int = 1,
              resumed_step: int = 0, peak: tuple[int, int] | None = None,
              machine: dict[str, Any] | None = None,
              device_mismatch: str | None = None, *, resumed_by: str | None = None,
              restarts: int = 0, stopped_early: str | None = None, steps: int | None = None,
              checkpointed: bool = True) -> dict[str, Any]:
    """Measured medians over this run's steps after `warmup` (None when it had none: a
    warm-up step is no measurement), and the prediction for the plan. `steps` counts the
    run's steps including those before `resumed_from`, the checkpoint step its history starts
    after, which `resumed_by` (RESUMED_BY; None: nothing was loaded) loaded; `restarts`: the
    torchrun restarts before it. `peak`: (bytes, rank) of the largest rank's training peak
    (job_peak); without it, this rank's step peaks. `device_mismatch`: machine.device_mismatch's
    line when the plan's profile describes another device, which makes measured and predicted
    incomparable (noted, and the table shows no ratios). `stopped_early`: why the run stopped
    before `steps` (--steps; a signal's name), None when it did not: a stop asked during the
    last step stopped nothing, and the summary says none. `checkpointed`: the run saved
    checkpoints (--checkpoint-dir), which a run stopped early can be resumed from."""
    assert resumed_by is None or resumed_by in RESUMED_BY, resumed_by
    if steps is not None and history and history[-1].step >= steps:
        stopped_early = None  # every step of --steps trained (and saved): nothing to resume
    steady = history[warmup:]
    step_time = statistics.median(m.step_time_s for m in steady) if steady else None
    measured = {
        "step_time_s": step_time,
        # tokens per step / the median step time (a median of its own would not match it)
        "tokens_per_s": (steady[0].tokens_per_s * steady[0].step_time_s / step_time
                         if step_time else None),
        "memory_bytes": (peak[0] if peak is not None and history
                         else max((m.peak_memory_bytes for m in history), default=None)),
        "memory_rank": peak[1] if peak is not None and history else (0 if history else None),
    }
    pred, missing = predicted(plan)
    final = history[-1].loss if history else None
    return {
        "steps": history[-1].step if history else resumed_step,
        "steps_this_run": len(history),
        "resumed_from": resumed_step,
        "resumed_by": resumed_by,
        "restarts": restarts,
        "stopped_early": stopped_early,
        "final_step": history[-1].step if history else None,
        "final_loss": final if final is not None and math.isfinite(final) else None,
        "skipped_steps": sum(m.skipped for m in history),
        "measured": measured,
        "predicted": pred,
        "machine": machine or {},
        "device_mismatch": device_mismatch,
        "note": joined(_on_prediction(step_time, pred, missing, machine, device_mismatch,
                                      plan.world_size),
                       unmeasured(history, warmup, resumed_step, stopped_early,
                                  checkpointed),
                       diverged(history)),
    }


def _on_prediction(step_time: float | None, pred: dict[str, Any] | None, missing: str | None,
                   machine: dict[str, Any] | None, device_mismatch: str | None,
                   ranks: int) -> str | None:
    """What of the summary's note concerns the prediction: the device mismatch, why there is
    none, or a step time outside its error band (a diverged loss says nothing of it)."""
    off = None if device_mismatch or pred is None else band_note(
        step_time, pred["step_time_s"], pred["error_band"], machine, ranks)
    return joined(device_mismatch, missing, off)


def prediction_note(summary: dict[str, Any], plan: Any) -> str | None:
    """The run record's predicted.note: the part of the summary's note on the prediction,
    rebuilt from the summary (and, where it holds no prediction, from the cost model's reason
    for `plan`), so the summary says it once, in `note`."""
    pred = summary.get("predicted")
    missing = None if pred else predicted(plan)[1]
    return _on_prediction((summary.get("measured") or {}).get("step_time_s"), pred, missing,
                          summary.get("machine"), summary.get("device_mismatch"),
                          plan.world_size)


def run_record(summary: dict[str, Any], plan: Any) -> dict[str, Any]:
    """The run record `autoplan calibrate` reads (calibrate.load_run; the format tune writes):
    the plan as run, the profile it was predicted with, measured and predicted numbers, what
    of the summary's note concerns the prediction under predicted (a step time outside the
    error band, a device mismatch, no cost model) and the host's load under machine
    (machine.host_load)."""
    from autoplan.plan_files import plan_to_dict

    m = summary["measured"]
    pred = summary.get("predicted") or {}
    return {
        "schema_version": 1,
        "plan": plan_to_dict(plan),
        "profile": plan.cluster.profile,
        "measured": {"step_time_s": m.get("step_time_s"),
                     "peak_memory_bytes": m.get("memory_bytes"),
                     "peak_memory_rank": m.get("memory_rank"),
                     "tokens_per_s": m.get("tokens_per_s"),
                     "steps": summary.get("steps_this_run"),
                     # the signal that stopped the run short of --steps (None: it ran them all)
                     "stopped_early": summary.get("stopped_early") or None},
        "predicted": {"step_time_s": pred.get("step_time_s"),
                      "memory_total_bytes": pred.get("memory_bytes"),
                      "error_band": pred.get("error_band"),
                      "note": prediction_note(summary, plan)},
        "machine": {"torch": torch.__version__, "world_size": plan.world_size,
                    **(summary.get("machine") or {})},
    }


MAX_RECORD_SIBLINGS = 1000
"""How many numbered names (NAME.1.json, ...) write_run_record tries beside a taken path."""


def write_run_record(path: str, summary: dict[str, Any], plan: Any) -> Path:
    """Write the run record atomically and return where it went. An existing file is never
    replaced: the flag's checks refused one before training, so a file at `path` now appeared
    during the run, and the record (the result of the whole run) goes to the first free
    numbered sibling (run.json -> run.1.json, run.2.json, ...) with one warning naming both."""
    from autoplan import fsutil
    from autoplan.errors import ConfigError

    text = json.dumps(run_record(summary, plan), indent=2)
    wanted = Path(path)
    for n in range(MAX_RECORD_SIBLINGS + 1):
        target = wanted if n == 0 else wanted.with_name(f"{wanted.stem}.{n}{wanted.suffix}")
        if os.path.lexists(target):
            continue
        try:
            fsutil.write_text(target, text, field="--run-record")
        except ConfigError:
            if os.path.lexists(target):
                continue  # taken between the look and the write
            raise
        if n:
            log.warning("--run-record: %s appeared during the run and is left as it is; "
                        "wrote the run record to %s instead", wanted, target)
        return target
    raise ConfigError("--run-record", f"{str(wanted)!r} and {MAX_RECORD_SIBLINGS} numbered "
                      "names beside it are taken", "choose another path")


def summary_title(summary: dict[str, Any]) -> str:
    """The summary table's title: the run's steps, counted from step 0 as the JSON's `steps`,
    with the checkpoint step it continued from (the JSON's `resumed_from`) where it resumed,
    and the final loss."""
    if summary.get("final_loss") is None:
        return "autoplan train"
    resumed = summary.get("resumed_from") or 0
    since = f" (resumed from step {resumed})" if resumed else ""
    return (f"autoplan train: {summary['steps']} steps{since}, final loss "
            f"{summary['final_loss']:.4f}")


def render_summary(console, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=summary_title(summary))
    table.add_column("quantity")
    table.add_column("measured", justify="right")
    pred = summary.get("predicted") or {}
    priced = (f" ({pred['runtime']}, step ±{pred['error_band']:.0%})"
              if pred.get("runtime") and pred.get("error_band") is not None else "")
    table.add_column(f"predicted{priced}", justify="right")
    table.add_column("measured / predicted", justify="right")
    fmt = {"step_time_s": "{:.4f} s", "tokens_per_s": "{:,.0f}", "memory_bytes": "{:,.0f} B"}
    comparable = not summary.get("device_mismatch")
    for key, f in fmt.items():
        m, p = summary["measured"].get(key), pred.get(key)
        ratio = "-" if m is None or not p else (
            f"{m / p:.2f}" if comparable else "not comparable")  # the note says why
        name = key
        if key == "memory_bytes" and summary["measured"].get("memory_rank") is not None:
            name = f"memory_bytes (rank {summary['measured']['memory_rank']}, the largest)"
        table.add_row(name, f.format(m) if m is not None else "-",
                      f.format(p) if p is not None else "-", ratio)
    console.print(table)
    restarts = summary.get("restarts") or 0
    if restarts:
        console.print(f"restarts: {restarts} (torchrun restarted the ranks after a failure; "
                      f"measured over the steps after checkpoint step {summary['resumed_from']},"
                      " which the last restart resumed from)")
    if summary.get("stopped_early"):
        step = summary.get("final_step")
        when = f"after step {step}" if step is not None else "before its first step"
        console.print(f"stopped early by {summary['stopped_early']} {when}")
    if summary.get("note"):
        console.print(f"note: {summary['note']}")
