"""What the search optimises and what it must meet: objectives, target constraints, and the
reasons a scored candidate misses them, as numpy columns over a whole table.

Objective values are oriented so that smaller is better; `display_value` turns them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from autoplan.cost.memory import total_at_p75
from autoplan.cost.step_memory import node_host_bytes
from autoplan.display import days as days_text
from autoplan.display import whole
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile

OBJECTIVES = ("throughput", "latency", "cost", "gpus")
SECONDS_PER_DAY = 86400.0
COST_TOKENS_DEFAULT = 1e9
"""Without --train-tokens, cost is GPU-hours per 1e9 tokens."""
GIB = 2**30
MEMORY_SLACKS = ("median", "p75")
"""Targets.memory_slack: the allocator slack of published OOM messages a plan must fit with."""


@dataclass(frozen=True)
class Targets:
    objectives: tuple[str, ...] = ("throughput",)
    """throughput (max tokens/s) | latency (min step time) | cost (min US dollars where every
    profile has a price_per_gpu_hour, else GPU-hours) | gpus (the smallest GPU count, e.g.
    with --min-tokens-per-s and --num-gpus A..B)."""
    max_step_time_s: float | None = None
    min_tokens_per_s: float | None = None
    deadline_days: float | None = None
    """Train `train_tokens` within this many days."""
    train_tokens: float | None = None
    """Token budget: turns cost into GPU-hours and enables the deadline."""
    memory_slack: str = "median"
    """The allocator slack a plan must fit with: `median` (the cost model's, memory.FRAGMENTATION)
    or `p75` (memory.FRAGMENTATION_P75: no plan that is tight)."""

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ConfigError("--objective", "got nothing", f"choose from {', '.join(OBJECTIVES)}")
        for o in self.objectives:
            if o not in OBJECTIVES:
                raise ConfigError("--objective", f"got {o!r}",
                                  f"choose from {', '.join(OBJECTIVES)} (comma-separated)")
        if len(set(self.objectives)) != len(self.objectives):
            raise ConfigError("--objective", f"got {','.join(self.objectives)}",
                              "name each objective once")
        for name in ("max_step_time_s", "min_tokens_per_s", "deadline_days", "train_tokens"):
            value = getattr(self, name)
            if value is not None and not (np.isfinite(value) and value > 0):
                raise ConfigError(f"--{name.replace('_', '-')}", f"got {value}",
                                  "expected a positive number")
        if self.memory_slack not in MEMORY_SLACKS:
            raise ConfigError("--memory-slack", f"got {self.memory_slack!r}",
                              f"choose from {', '.join(MEMORY_SLACKS)}")
        if self.deadline_days is not None and self.train_tokens is None:
            raise ConfigError("--deadline-days", "needs --train-tokens",
                              "give the token budget, e.g. --train-tokens 3e11")

    @property
    def cost_tokens(self) -> float:
        return self.train_tokens if self.train_tokens is not None else COST_TOKENS_DEFAULT

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1


def gpu_hours(tokens_per_s: np.ndarray, num_gpus: np.ndarray, tokens: float) -> np.ndarray:
    return np.asarray(num_gpus, float) * tokens / np.asarray(tokens_per_s, float) / 3600.0


def objective_matrix(cols: Mapping[str, np.ndarray], targets: Targets) -> np.ndarray:
    """(rows x objectives), smaller is better: -tokens/s, step seconds, GPU-hours, GPUs."""
    out = []
    for o in targets.objectives:
        if o == "throughput":
            out.append(-np.asarray(cols["tokens_per_s"], float))
        elif o == "latency":
            out.append(np.asarray(cols["time_step"], float))
        elif o == "gpus":
            out.append(np.asarray(cols["num_gpus"], float))
        else:
            out.append(cost_of(cols, targets))
    return np.stack(out, axis=1)


def cost_of(cols: Mapping[str, np.ndarray], targets: Targets) -> np.ndarray:
    """The cost objective: US dollars (GPU-hours times the profile's price per GPU-hour) when
    every row's profile has a price, else GPU-hours."""
    hours = gpu_hours(cols["tokens_per_s"], cols["num_gpus"], targets.cost_tokens)
    price = cols.get("price_per_gpu_hour")
    if price is not None and len(price) and np.isfinite(price).all():
        return hours * np.asarray(price, float)
    return hours


def display_value(objective: str, value: float) -> float:
    return -value if objective == "throughput" else value


MISS_KEYS = ("out-of-memory", "host-memory", "step-time", "tokens-per-s", "deadline")
"""Reasons a valid, scored candidate is not feasible, in the order they are reported."""


def device_need(cols: Mapping[str, np.ndarray], targets: Targets) -> np.ndarray:
    """Bytes per GPU a plan must fit: its priced total, or that total with the allocator's
    75th-percentile slack under `--memory-slack p75`."""
    total = np.asarray(cols["mem_total"], float)
    if targets.memory_slack == "p75":
        return total_at_p75(total, cols["mem_allocator"])
    return total


def miss_ratios(cols: Mapping[str, np.ndarray], targets: Targets,
                profile: ClusterProfile) -> np.ndarray:
    """(rows x MISS_KEYS) relative shortfall: > 0 misses by that fraction, <= 0 is met."""
    n = len(cols["tokens_per_s"])
    ratios = np.full((n, len(MISS_KEYS)), -1.0)
    ratios[:, 0] = device_need(cols, targets) / profile.device.memory_bytes - 1.0
    per_node = node_host_bytes(profile, cols["mem_total"], cols["mem_host"], cols["num_gpus"])
    ratios[:, 1] = per_node / profile.host.memory_bytes - 1.0
    if targets.max_step_time_s is not None:
        ratios[:, 2] = np.asarray(cols["time_step"]) / targets.max_step_time_s - 1.0
    if targets.min_tokens_per_s is not None:
        ratios[:, 3] = targets.min_tokens_per_s / np.asarray(cols["tokens_per_s"]) - 1.0
    if targets.deadline_days is not None and targets.train_tokens is not None:
        days = targets.train_tokens / np.asarray(cols["tokens_per_s"]) / SECONDS_PER_DAY
        ratios[:, 4] = days / targets.deadline_days - 1.0
    return np.nan_to_num(ratios, nan=np.inf)


def miss_messages(row: Mapping[str, float], targets: Targets,
                  profile: ClusterProfile) -> list[str]:
    """What one scored candidate misses, by how much (empty when it meets everything)."""
    out = []
    memory_bytes, host_bytes = profile.device.memory_bytes, profile.host.memory_bytes
    need = float(device_need({k: np.asarray(v) for k, v in row.items()}, targets))
    if need > memory_bytes:
        at = " at the allocator's 75th-percentile slack" if targets.memory_slack == "p75" else ""
        out.append(f"needs {need / GIB:.1f} GiB of {memory_bytes / GIB:.1f} GiB per GPU{at}")
    host = float(node_host_bytes(profile, row["mem_total"], row["mem_host"], row["num_gpus"]))
    if host > host_bytes:
        out.append(f"needs {host / GIB:.1f} GiB of host memory of {host_bytes / GIB:.1f} GiB "
                   "per node")
    if targets.max_step_time_s is not None and row["time_step"] > targets.max_step_time_s:
        out.append(f"takes {row['time_step']:.3g} s per step of at most "
                   f"{targets.max_step_time_s:g} s")
    if targets.min_tokens_per_s is not None and row["tokens_per_s"] < targets.min_tokens_per_s:
        out.append(f"reaches {whole(row['tokens_per_s'])} tokens/s of at least "
                   f"{whole(targets.min_tokens_per_s)}")
    if targets.deadline_days is not None and targets.train_tokens is not None:
        days = targets.train_tokens / row["tokens_per_s"] / SECONDS_PER_DAY
        if days > targets.deadline_days:
            out.append(f"needs {days_text(days)} days for {targets.train_tokens:.3g} tokens of at "
                       f"most {targets.deadline_days:g}")
    return out
