"""Step metrics: this rank's peak memory, a live line on stderr and the JSONL file of step
records (with the checks a resume makes of it); runtime/summary sums them up at the end."""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

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
