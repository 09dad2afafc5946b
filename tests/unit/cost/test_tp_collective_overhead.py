"""Efficiency.tp_collective_overhead_s: loaded strictly, and priced as DTensor's host seconds
on every tensor-parallel call comm.TP_CALLS counts, only at tp > 1 and only for a runtime that
pays host costs (step_time.priced_profile)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from autoplan.cost import comm
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime
from autoplan.cost.step_time import TIME_PARTS, priced_profile
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, ClusterSpec, load_profile, profile_from_dict
from autoplan.model_spec import PRESETS
from autoplan.plan import Plan, plan_from_dict
from autoplan.resources import PROFILES, find

OVERHEAD_S = 5e-4


def _raw() -> dict[str, Any]:
    path = find(PROFILES, "cpu-gloo")
    assert path is not None
    return yaml.safe_load(Path(path).read_text())


def _with(raw: dict[str, Any], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    raw["efficiency"]["tp_collective_overhead_s"] = value
    return raw


def _profile(seconds: float) -> ClusterProfile:
    p = load_profile("cpu-gloo")
    return dataclasses.replace(p, efficiency=dataclasses.replace(
        p.efficiency, tp_collective_overhead_s=seconds))


def test_the_field_loads_and_defaults_to_zero() -> None:
    raw = _raw()
    raw["efficiency"].pop("tp_collective_overhead_s", None)
    assert profile_from_dict(raw).efficiency.tp_collective_overhead_s == 0.0
    assert profile_from_dict(_with(raw, 3e-4)).efficiency.tp_collective_overhead_s == 3e-4
    assert load_profile("h100-sxm-80gb").efficiency.tp_collective_overhead_s == 0.0


@pytest.mark.parametrize("value", [-1e-4, "fast", True, None, 2.0])
def test_a_negative_non_number_or_huge_value_is_one_line_naming_the_field(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        profile_from_dict(_with(_raw(), value))
    text = str(err.value)
    assert "tp_collective_overhead_s" in text and "\n" not in text


def _plan(tp: int, **extra: Any) -> Plan:
    """The closed loop's plan shape (benchmarks/closed_loop.py make_plan): the tiny model, 4
    micro-batches of 4 sequences."""
    return plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": tp},
                           "precision": "fp32", "zero_stage": 0, "parallel": {"tp": tp},
                           "batch": {"micro_batch_size": 4, "global_batch_size": 16}, **extra})


def _times(plan: Plan, seconds: float) -> dict[str, float]:
    est = estimate_plan(plan, ClusterSpec(_profile(seconds), plan.cluster.num_gpus),
                        runtime="autoplan")
    assert not est.reasons, est.reasons
    return {k: float(v) for k, v in est.time.items()}


def _calls(part: str, sp: bool = False) -> int:
    off, on = comm.TP_CALLS[part]
    return sum((on if sp else off).values())


@pytest.mark.parametrize("recompute", [None, "full"])
def test_tp2_prices_exactly_calls_times_overhead_more_tp_comm(recompute: str | None) -> None:
    """One stage of 4 blocks, 4 micro-batches: each micro-batch's blocks, embedding and head
    (and a fully recomputed block's forward collectives again), as TP_CALLS counts them."""
    extra = {"recompute": {"policy": recompute}} if recompute else {}
    plan = _plan(2, **extra)
    layers, micro = PRESETS["tiny"].num_layers, 16 // 4
    calls = layers * _calls("layer") + _calls("embedding") + _calls("head")
    if recompute:
        calls += layers * _calls("recompute_full")
    base, charged = _times(plan, 0.0), _times(plan, OVERHEAD_S)
    assert charged["tp_comm"] - base["tp_comm"] == pytest.approx(
        micro * calls * OVERHEAD_S, rel=1e-9)
    for part in TIME_PARTS:
        if part != "tp_comm":
            assert charged[part] == base[part], part


def test_tp1_is_unchanged() -> None:
    assert _times(_plan(1), OVERHEAD_S) == _times(_plan(1), 0.0)


@pytest.mark.parametrize("sp", [False, True])
def test_each_part_gains_its_tp_calls(sp: bool) -> None:
    """tensor_parallel_time_s per part, sequence parallel or not: TP_CALLS' calls x overhead
    at tp 2 (and norm_grad's one redistribute under sequence parallelism), nothing at tp 1."""
    model, msg = PRESETS["tiny"], np.full(1, 65536.0)
    inside, sp_ = np.ones(1, bool), np.full(1, sp)
    for tp in (1.0, 2.0):
        t = np.full(1, tp)
        base = comm.tensor_parallel_time_s(model, msg, msg, t, sp_, inside, _profile(0.0))
        charged = comm.tensor_parallel_time_s(model, msg, msg, t, sp_, inside,
                                              _profile(OVERHEAD_S))
        for part in comm.TP_CALLS:
            want = _calls(part, sp) * OVERHEAD_S if tp > 1 else 0.0
            assert np.allclose(charged[part] - base[part], want, rtol=0, atol=1e-15), part
        want = OVERHEAD_S if tp > 1 and sp else 0.0
        assert np.allclose(charged["norm_grad"] - base["norm_grad"], want, rtol=0, atol=1e-15)


def test_a_runtime_that_pays_no_host_costs_is_not_charged() -> None:
    """Megatron's and torchtitan's ops are not autoplan's: the figure does not describe them."""
    for name in ("torchtitan", "megatron"):
        priced = priced_profile(_profile(OVERHEAD_S), load_runtime(name))
        assert priced.efficiency.tp_collective_overhead_s == 0.0
    priced = priced_profile(_profile(OVERHEAD_S), load_runtime("autoplan", on_cpu=True))
    assert priced.efficiency.tp_collective_overhead_s == OVERHEAD_S
