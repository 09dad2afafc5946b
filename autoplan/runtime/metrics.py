"""Step metrics: a live line on stderr, a JSONL file, and the end-of-run summary with the cost
model's prediction for the same plan next to the measurement."""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import resource
import statistics
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from autoplan.runtime.summary_notes import band_note, diverged, joined, unmeasured

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    step_time_s: float
    tokens_per_s: float
    peak_memory_bytes: int
    grad_norm: float | None
    """None when the step was skipped (fp16 overflow: the norm is inf/NaN)."""
    loss_scale: float | None = None
    """fp16 dynamic loss scale this step ran with; None without loss scaling."""
    skipped: bool = False
    """The optimizer step was skipped on every rank (fp16 overflow)."""


_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak: CUDA's peak counter; on CPU the process's peak resident set size
    (VmHWM; Linux resets it on writing 5 to /proc/self/clear_refs). False where it cannot."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; on CPU the peak resident set size of the process
    since reset_peak_memory (VmHWM), or since it started where /proc has no VmHWM."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


class TrainingPeak:
    """This rank's peak memory over its training steps, each measured from its own start, so
    what a checkpoint load or save held between steps is not counted (the cost model prices
    training). Where the peak cannot be reset, only the steps before the first save count."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0
        self._resettable = True
        self._saved = False

    def start_step(self) -> None:
        self._resettable = reset_peak_memory(self.device)

    def end_step(self) -> int:
        """This step's peak (also folded into the training peak)."""
        step = peak_memory_bytes(self.device)
        if self._resettable or not self._saved:
            self.bytes = max(self.bytes, step)
        return step

    def saved(self) -> None:
        """A checkpoint was saved after the last step."""
        self._saved = True


def job_peak(local_bytes: int) -> tuple[int, int]:
    """(the largest rank's peak, that rank): one all-reduce MAX of a world-sized tensor on the
    job's process group (gloo carries CPU tensors under NCCL too). One process: its own."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return local_bytes, 0
    peaks = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    peaks[dist.get_rank()] = local_bytes
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    rank = int(torch.argmax(peaks))
    return int(peaks[rank]), rank


class MetricsSink:
    """Rank 0 only: prints a live line per step and appends JSONL records.

    `resumed_step`: the run continues after that step (a resume or a torchrun restart), so the
    file keeps only the records up to it and every step appears exactly once. A file whose
    records end before `resumed_step` (steps trained without it) is warned about when
    `warn_gap` (once per launch: a torchrun restart finds the same gap and says nothing)."""

    def __init__(self, metrics_file: str | None, live: bool = True,
                 resumed_step: int = 0, warn_gap: bool = True) -> None:
        self.path = Path(metrics_file) if metrics_file else None
        self.live = live
        self.history: list[StepMetrics] = []
        self.resumed_step = resumed_step
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                truncate_after(self.path, resumed_step)
                gap = metrics_gap(self.path, last_recorded_step(self.path), resumed_step)
                if gap and warn_gap:
                    log.warning("%s", gap)
        self._console = None
        if live:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, soft_wrap=True)

    def record(self, m: StepMetrics) -> None:
        self.history.append(m)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record_dict(m), allow_nan=False) + "\n")
        if self._console is not None:
            norm = "-" if m.grad_norm is None else f"{m.grad_norm:.3f}"
            scale = "" if m.loss_scale is None else f"  scale {m.loss_scale:g}"
            skip = "  [yellow]skipped (overflow)[/]" if m.skipped else ""
            self._console.print(
                f"[bold]step {m.step:>5}[/]  loss [cyan]{m.loss:.4f}[/]  "
                f"{m.tokens_per_s:>10,.0f} tok/s  {m.step_time_s * 1e3:8.1f} ms/step  "
                f"mem {m.peak_memory_bytes / 2**20:8.1f} MiB  |g| {norm}{scale}{skip}"
            )
            sys.stderr.flush()


def record_dict(m: StepMetrics) -> dict[str, Any]:
    """The JSONL record of `m`: a non-finite number (a diverged loss) as null, so every line
    is JSON (bare NaN is not)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in asdict(m).items()}


_RECORD_KEYS = {f.name: f.default is MISSING for f in fields(StepMetrics)}
"""The keys of a line MetricsSink writes (json of a StepMetrics), each with whether it is
required (records of a runtime before loss_scale and skipped lack those)."""
_RECORD_START = '{"step": '
"""How every record begins (json.dumps keeps the dataclass order): a line torn by a kill too."""


def _is_number(value: Any, *, none: bool = False) -> bool:
    if value is None:
        return none
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_step_record(rec: Any) -> bool:
    """Whether `rec` (a parsed JSON line) has the shape of a StepMetrics record."""
    if not isinstance(rec, dict) or not set(rec) <= set(_RECORD_KEYS):
        return False
    if any(required and key not in rec for key, required in _RECORD_KEYS.items()):
        return False
    step = rec["step"]
    return (isinstance(step, int) and not isinstance(step, bool) and step >= 1
            and _is_number(rec["loss"], none=True)  # null: not finite (diverged)
            and all(_is_number(rec[k]) for k in ("step_time_s", "tokens_per_s"))
            and isinstance(rec["peak_memory_bytes"], int)
            and _is_number(rec["grad_norm"], none=True)
            and _is_number(rec.get("loss_scale"), none=True)
            and isinstance(rec.get("skipped", False), bool))


def metrics_file_problem(path: Path) -> str | None:
    """None when every complete line of `path` is a step record (blank lines aside) and a last
    line without its newline is the start of one (a write cut short by a kill): the file a
    run's MetricsSink wrote. Else what is wrong, with the line number."""
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                text = raw.decode("utf-8", errors="replace")
                if not raw.endswith(b"\n"):  # the torn last line
                    if _RECORD_START.startswith(text) or text.startswith(_RECORD_START):
                        return None
                    return f"line {number} is not a step record: {text[:40]!r}"
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except ValueError:
                    rec = None
                if not is_step_record(rec):
                    return f"line {number} is not a step record: {text.rstrip()[:40]!r}"
    except OSError as err:
        return f"cannot read it ({err.strerror})"
    return None


def truncate_after(path: Path, step: int) -> int:
    """Drop the records past `step` (and a torn last line) from a metrics file, atomically;
    returns how many were kept."""
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return len(kept)


def last_recorded_step(path: str | Path | None) -> int | None:
    """The step of the last whole record in a metrics file (None without a file or a record)."""
    if path is None:
        return None
    last = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                    last = rec["step"]
    except OSError:
        return None
    return last


def metrics_gap(path: Path, last: int | None, resumed_step: int) -> str | None:
    """The warning when a metrics file whose records end at step `last` is continued by a run
    resuming at `resumed_step`: the steps between were trained without it (a resume without
    --metrics-file). None when nothing is missing; a file without records is a new file."""
    if last is None or last >= resumed_step:
        return None
    missing = (f"step {resumed_step} is" if last + 1 == resumed_step
               else f"steps {last + 1}-{resumed_step} are")
    return (f"--metrics-file {path} ends at step {last} but the run resumes at step "
            f"{resumed_step}; {missing} not in it")


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
    from autoplan.plan import plan_to_dict

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
