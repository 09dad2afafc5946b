"""Pricing run records under a profile: each run's predicted / measured - 1 for the step time
(step_errors, one plan at a time with estimate_plan; StepPricer, the same as one table per
model for a fit that prices the runs hundreds of times) and for peak memory (memory_errors)."""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.calibrate_runs import RunRecord
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterProfile, ClusterSpec


def step_errors(runs: list[RunRecord], profile: ClusterProfile) -> list[float]:
    """predicted / measured - 1 for each run's step time."""
    out = []
    for run in runs:
        est = estimate_plan(run.plan, ClusterSpec(profile, run.plan.cluster.num_gpus))
        out.append(est.step_time_s / run.measured.step_time_s - 1.0)
    return out


class StepPricer:
    """step_errors of fixed runs under any profile, with what no factor changes (each run's
    model, plan row and runtime traits) done once and the runs of one model, precision and
    attention priced as one table (estimate_table, as estimate_plan prices one): a fit prices
    the runs hundreds of times."""

    def __init__(self, runs: list[RunRecord], profile: ClusterProfile) -> None:
        from autoplan.cost.estimate import default_runtime
        from autoplan.plan_table import plan_to_row

        self.traits = default_runtime(profile)  # a factor never makes a CPU profile a GPU's
        rows: list[Any] = []
        groups: dict[tuple, list[int]] = {}  # (model, precision, attention, columns) -> runs
        for i, run in enumerate(runs):
            model = run.plan.model_spec()
            rows.append(plan_to_row(run.plan, model))
            precision = run.plan.precision.value
            if precision not in profile.device.peak_flops_per_s:  # as estimate_plan falls back
                precision = next(iter(profile.device.peak_flops_per_s))
            key = (model, precision, run.plan.attention.value, tuple(sorted(rows[-1])))
            groups.setdefault(key, []).append(i)
        self.tables = [(model, precision, attention, np.array(where), {
            col: np.concatenate([np.atleast_1d(rows[i][col]) for i in where]) for col in cols})
            for (model, precision, attention, cols), where in groups.items()]
        self.measured_s = np.array([run.measured.step_time_s for run in runs], dtype=float)

    def __call__(self, profile: ClusterProfile) -> list[float]:
        from autoplan.cost.estimate import estimate_table

        predicted = np.empty_like(self.measured_s)
        for model, precision, attention, where, table in self.tables:
            predicted[where] = estimate_table(table, model, profile, precision, attention,
                                              self.traits)["time_step"]
        return [float(e) for e in predicted / self.measured_s - 1.0]


def memory_errors(runs: list[RunRecord], profile: ClusterProfile) -> list[float]:
    out = []
    for run in runs:
        if run.measured.peak_memory_bytes:
            est = estimate_plan(run.plan, ClusterSpec(profile, run.plan.cluster.num_gpus))
            out.append(est.memory_total_bytes / run.measured.peak_memory_bytes - 1.0)
    return out
