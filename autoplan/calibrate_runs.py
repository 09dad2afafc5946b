"""Run records, as `autoplan train --run-record` writes them (runtime/summary.run_record) and
`autoplan tune` does (tune/study.run_record): load_run reads one strictly, naming the file in
every error, since calibrate reads many; plan_key tells runs of different plans apart, and
busy_host says which ran on a host other processes kept busy."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.plan import Plan, plan_from_dict
from autoplan.plan_files import plan_identity
from autoplan.yaml_io import (
    check_schema_version,
    from_dict,
    read_yaml,
    show,
    unknown_key_fix,
)

MAX_STEP_TIME_S = 1e6
"""Longest measured step a run record may hold (11.6 days): far past it predicted / measured
rounds to 0 and the log error of the fit is undefined."""
MIN_STEP_TIME_S = 1e-9
"""Shortest measured step (a nanosecond): far below it predicted / measured overflows."""


@dataclass(frozen=True)
class Measured:
    step_time_s: float
    """Median seconds per optimizer step after warm-up."""
    peak_memory_bytes: float | None = None
    """Peak memory of the busiest rank (device memory on a GPU, RSS growth on CPU)."""
    tokens_per_s: float | None = None
    steps: int | None = None

    def __post_init__(self) -> None:
        if not self.step_time_s > 0:
            raise ConfigError("measured.step_time_s", f"got {self.step_time_s}",
                              "expected a positive number of seconds")
        if not MIN_STEP_TIME_S <= self.step_time_s <= MAX_STEP_TIME_S:
            raise ConfigError("measured.step_time_s", f"got {self.step_time_s:g}",
                              f"expected seconds per step from {MIN_STEP_TIME_S:g} to "
                              f"{MAX_STEP_TIME_S:g}")
        if self.peak_memory_bytes is not None and not self.peak_memory_bytes > 0:
            raise ConfigError("measured.peak_memory_bytes", f"got {self.peak_memory_bytes}",
                              "expected a positive number of bytes, or leave it out")


@dataclass(frozen=True)
class HostLoad:
    """The 1-minute load average of rank 0's host when the run started and when it ended, on
    its CPUs (runtime/machine.host_load), and the run's ranks."""

    cpu_count: int
    start: float | None
    end: float | None
    ranks: int

    @property
    def others(self) -> float:
        """The load of other processes: the start's, taken before the ranks add to it, or the
        end's less one per rank (a CPU rank is one runnable task under OMP_NUM_THREADS=1; the
        ranks of other nodes are subtracted too, which errs towards no warning), the higher."""
        seen = [x for x in (self.start, None if self.end is None else self.end - self.ranks)
                if x is not None]
        return max(seen, default=0.0)

    @property
    def busy(self) -> bool:
        """Other processes alone kept more tasks runnable than the host has CPUs, so each of
        the run's ranks got less than the CPU time the profile was measured with (the run's
        own ranks time-sharing the CPUs are priced: host.compute_slots)."""
        return self.others > self.cpu_count


@dataclass(frozen=True)
class RunRecord:
    plan: Plan
    measured: Measured
    profile: str | None = None
    """Profile the run was predicted with (name or path)."""
    source: str = ""
    device: str | None = None
    """The device the run trained on (machine.device: `cpu` or the GPU's name, as torch
    names it); None in records written before train recorded it."""
    host_load: HostLoad | None = None
    """The host's load while the run trained (machine.host_load); None where the record has
    none (records written before train and tune kept it)."""


def busy_host(run: RunRecord) -> str | None:
    """The warning for a run measured on a busy host (HostLoad.busy), in words; None for a
    quiet one or a record without the load."""
    load = run.host_load
    if load is None or not load.busy:
        return None
    seen = " -> ".join(f"{x:.2f}" for x in (load.start, load.end) if x is not None)
    return (f"{run.source} ran at load {seen} on {load.cpu_count} CPUs, {load.others:.2f} of "
            f"it other processes' (its {load.ranks} rank{'s' if load.ranks > 1 else ''} left "
            "out), more than the CPUs: the fit takes the load for the machine's speed; "
            "re-measure on a quiet host")


def load_run(path: str | Path) -> RunRecord:
    data = read_yaml(path, "RUN")  # JSON is YAML, so both load; read_yaml names the path
    if not isinstance(data, dict):
        raise ConfigError(f"RUN {path}", "expected a mapping with plan and measured")
    data = check_schema_version(data, "run")
    for key in ("plan", "measured"):
        if key not in data:
            raise ConfigError(f"RUN {path}: {key}", "missing", "pass a run record written by "
                              "`autoplan train --run-record FILE`")
    known = {"plan", "measured", "profile", "predicted", "metrics", "machine"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"RUN {path}: {sorted(unknown)[0]}", "unknown key",
                          unknown_key_fix(sorted(unknown)[0], sorted(known)))
    _check_measured_step(path, data["measured"])
    try:
        measured = from_dict(Measured, {k: v for k, v in data["measured"].items()
                                        if k in {f.name for f in dataclasses.fields(Measured)}}
                             if isinstance(data["measured"], dict) else data["measured"],
                             "measured")
    except ConfigError as err:  # name the run: calibrate reads many
        raise ConfigError(f"RUN {path}: {err.field}", err.problem, err.fix) from None
    profile = data.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"RUN {path}: profile", f"got {show(profile)}",
                          "expected the name or path of the profile the run was predicted with")
    plan = _run_plan(path, data["plan"])
    return RunRecord(plan=plan, measured=measured, profile=profile, source=str(path),
                     device=_recorded_device(path, data),
                     host_load=_recorded_load(path, data, plan.world_size))


def _run_plan(path: str | Path, data: Any) -> Plan:
    """The run's plan with its model loaded and the plan rules applied now, each mistake
    named with the run (calibrate reads many) before any study runs."""
    from autoplan.plan_rules import validate_plan

    try:
        plan = plan_from_dict(data)
        problems = validate_plan(plan, plan.model_spec())  # the plan's own GPU count
    except ConfigError as err:
        field = err.field if err.field.startswith("plan") else (
            f"plan.{err.field}" if err.field else "plan")
        raise ConfigError(f"RUN {path}: {field}", err.problem, err.fix) from None
    if problems:
        raise ConfigError(f"RUN {path}: plan", "; ".join(problems),
                          "pass run records of plans `autoplan train` ran")
    return plan


def _check_measured_step(path: str | Path, measured: Any) -> None:
    """A run with no step after its warm-up has no step time (train writes null)."""
    if isinstance(measured, dict) and "step_time_s" in measured \
            and measured["step_time_s"] is None:
        raise ConfigError(f"RUN {path}: measured.step_time_s", "null: the run had no step "
                          "after its warm-up step, so nothing was measured",
                          "calibrate with runs that train two steps or more (`autoplan "
                          "train --steps` counts from step 0, a resumed step included)")


def _recorded_device(path: str | Path, data: dict) -> str | None:
    machine = data.get("machine")
    if not isinstance(machine, dict) or machine.get("device") is None:
        return None
    device = machine["device"]
    if not isinstance(device, str) or not device.strip():
        raise ConfigError(f"RUN {path}: machine.device", f"got {show(device)}",
                          "expected the device the run trained on (cpu or a GPU's name)")
    return device


def _recorded_load(path: str | Path, data: dict, ranks: int) -> HostLoad | None:
    """machine.cpu_count and the 1-minute figure of machine.load_avg_start and _end (each the
    1-, 5- and 15-minute averages, or null where the OS has none); None without them."""
    machine = data.get("machine")
    if not isinstance(machine, dict) or machine.get("cpu_count") is None:
        return None
    cpus = machine["cpu_count"]
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise ConfigError(f"RUN {path}: machine.cpu_count", f"got {show(cpus)}",
                          "expected the host's CPU count (a positive integer), or null")
    first = []
    for key in ("load_avg_start", "load_avg_end"):
        avg = machine.get(key)
        ok = avg is None or (isinstance(avg, list) and 1 <= len(avg) <= 3 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= 0 for x in avg))
        if not ok:
            raise ConfigError(f"RUN {path}: machine.{key}", f"got {show(avg)}",
                              "expected the 1-, 5- and 15-minute load averages as `autoplan "
                              "train` records them ([1.2, 0.8, 0.5]), or null")
        first.append(None if avg is None else float(avg[0]))
    if first == [None, None]:
        return None
    return HostLoad(cpu_count=cpus, start=first[0], end=first[1], ranks=ranks)


def plan_key(plan: Plan) -> str:
    """A plan as trained, less what it was predicted at: runs with equal keys trained one plan,
    and one plan's runs tell the fit one number (its measured / predicted ratio)."""
    return plan_identity(plan)
