"""The notes the end-of-run summary adds (summary.summarize): a measured step time outside the
prediction's error band, with the host's load (a note on the prediction, which the run record
keeps); no step measured after the warm-up; a loss that stopped being finite. Each a line of
words, or None when there is nothing to say."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoplan.runtime.metrics import StepMetrics


def band_note(measured_s: float | None, predicted_s: float | None, band: float | None,
              machine: dict[str, Any] | None = None, ranks: int = 0) -> str | None:
    """The note when the measured step time lies outside the prediction's error band
    (predicted_s * (1 +- band)), saying by how much and, where recorded (machine.host_load),
    how loaded the host was (`ranks`: the run's, which count in the load at its end); None
    inside the band or when either side is missing."""
    if measured_s is None or not predicted_s or predicted_s <= 0 or band is None:
        return None
    ratio = measured_s / predicted_s
    if abs(ratio - 1) <= band:
        return None
    how = f"{ratio - 1:.0%} slower" if ratio > 1 else f"{1 - ratio:.0%} faster"
    # a band past 100% (fp8 MoE runs) has no lower end above zero
    low, high = predicted_s * max(0.0, 1 - band), predicted_s * (1 + band)
    note = (f"the measured step time {measured_s:.4g} s is {ratio:.2f}x the predicted "
            f"{predicted_s:.4g} s ({how}), outside the prediction's ±{band:.0%} error band "
            f"({low:.4g}-{high:.4g} s)")
    load = load_words(machine or {}, ranks)
    return f"{note}; {load}" if load else note


def joined(*notes: str | None) -> str | None:
    """The notes given, in order, as one line ("; " between them); None when none is."""
    return "; ".join(n for n in notes if n) or None


def load_words(machine: dict[str, Any], ranks: int = 0) -> str | None:
    """The host's 1-minute load average at the start and end of the run, on its CPUs; busy by
    calibrate's rule (calibrate_runs.HostLoad: other processes' load above the CPU count, the
    run's own `ranks` left out of the end's), so a run and its calibration agree."""
    from autoplan.calibrate_runs import HostLoad

    cpus, start, end = (machine.get(k) for k in ("cpu_count", "load_avg_start", "load_avg_end"))
    if not cpus or (not start and not end):
        return None
    seen = [f"{avg[0]:.2f} {name}" for name, avg in (("at the start", start), ("at the end", end))
            if avg]
    busy = HostLoad(int(cpus), start[0] if start else None, end[0] if end else None,
                    ranks).busy
    return (f"the host's load average was {' and '.join(seen)}, on {cpus} CPUs (this run's "
            f"ranks count in it){': a busy host slows every step' if busy else ''}")


def diverged(history: list[StepMetrics]) -> str | None:
    """The first step whose loss is not finite (NaN or inf), in words; None when none.
    fp16 overflow steps are skipped, not diverged: their loss is finite."""
    first = next((m for m in history if not math.isfinite(m.loss)), None)
    if first is None:
        return None
    return (f"the loss is not finite from step {first.step} on (the run diverged: the final "
            "loss is null; a lower --lr or --max-grad-norm may keep it finite; step times and "
            "memory are still measured)")


def unmeasured(history: list[StepMetrics], warmup: int, resumed_step: int = 0,
               stopped_early: str | None = None, checkpointed: bool = True) -> str | None:
    """Why a run has no step time, and the --steps (a total, counted from step 0) that gives
    it one step after the warm-up; or, where a signal stopped it before its --steps
    (`stopped_early`; a stop on the last step stopped nothing, summary.summarize), that
    resuming it measures one (its --steps was long enough), or rerunning it where it saved no
    checkpoint (not `checkpointed`: no --checkpoint-dir)."""
    if not history or len(history) > warmup:
        return None
    n = len(history)
    after = f" after resuming at step {resumed_step}" if resumed_step else ""
    trained = f"this run trained {n} step{'s' if n > 1 else ''}{after}"
    if stopped_early:
        again = ("resume it (--resume) to measure one" if checkpointed else
                 "without --checkpoint-dir it saved nothing to resume: rerun it to measure one")
        return (f"step time not measured: the run was stopped within its {warmup} warm-up "
                f"step{'s' if warmup > 1 else ''} ({trained}); {again}")
    return (f"step time not measured: the run had no step after its {warmup} warm-up "
            f"step{'s' if warmup > 1 else ''} ({trained}: --steps "
            f"{resumed_step + warmup + 1} or more measures one)")
