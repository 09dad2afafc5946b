"""Compute slowed by communication kernels: the collectives it hides (hardware
Efficiency.comm_slowdown, comm.contention_s) and the SMs Transformer Engine's pipelined
userbuffers overlap keeps (RuntimeTraits.userbuffers_*_sms)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan import resources
from autoplan.cost import block_comm, comm
from autoplan.cost.estimate import estimate_table
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime, runtime_from_dict
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile, profile_from_dict
from autoplan.model_spec import load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision
from autoplan.plan_table import plan_to_row
from autoplan.yaml_io import read_yaml

MODEL = load_model("llama-3.1-8b")
H100 = load_profile("h100-sxm-80gb")
FREE = dataclasses.replace(H100, efficiency=dataclasses.replace(H100.efficiency,
                                                                comm_slowdown=0.0))
"""The same profile where overlap costs the compute nothing."""


def _fsdp(dp: int = 64) -> Plan:
    return Plan(model="llama-3.1-8b", cluster=ClusterRef("h100-sxm-80gb", dp),
                batch=Batch(1, 4 * dp), parallel=Parallel(dp=dp), zero_stage=3,
                precision=Precision.BF16)


def _table(plan: Plan, profile, runtime) -> dict[str, np.ndarray]:
    return estimate_table(plan_to_row(plan, MODEL), MODEL, profile, "bf16", "flash", runtime)


def test_contention_is_the_work_the_overlap_displaces() -> None:
    """In h seconds beside a collective, compute slowed by s does h/(1+s) of its own work."""
    s = H100.efficiency.comm_slowdown
    assert s == pytest.approx(0.189)
    got = comm.contention_s(np.array([0.0, 1.0, 2.5]), H100)
    assert got == pytest.approx([0.0, s / (1 + s), 2.5 * s / (1 + s)])
    assert float(comm.contention_s(1.0, FREE)) == 0.0


def test_hidden_fsdp_collectives_cost_compute_bounded_by_their_time() -> None:
    """ZeRO-3 on 64 H100s hides most of its gathers and reductions: the slowdown adds
    time, but never more than s/(1+s) of every collective's own time (what fully exposed
    collectives take apart from the step's small syncs and FSDP2 copies)."""
    runtime = load_runtime("torchtitan")
    plan = _fsdp()
    slowed = _table(plan, H100, runtime)["time_dp_comm"][0]
    free = _table(plan, FREE, runtime)["time_dp_comm"][0]
    exposed_all = dataclasses.replace(runtime, overlap_dp_comm=False, overlap_param_gather=False)
    every = _table(plan, FREE, exposed_all)["time_dp_comm"][0]
    s = H100.efficiency.comm_slowdown
    assert slowed > free
    assert slowed - free <= every * s / (1 + s)


def test_link_bound_collectives_are_not_charged_the_slowdown_on_top() -> None:
    """Where the collectives outlast the compute beside them (ZeRO-3 of an 8B model over 64
    H100s at 256 tokens a micro-batch), the phase takes the links' time with the slowed
    compute inside it: the step is the same whether or not the collectives slow the compute.
    A window not stretched by the slowdown charged it on top of the link time."""
    runtime = load_runtime("torchtitan")
    short = dataclasses.replace(MODEL, seq_len=256)
    row = plan_to_row(_fsdp(), short)

    def times(profile) -> tuple[float, float]:
        t = estimate_table(row, short, profile, "bf16", "flash", runtime)
        return float(t["time_compute"][0]), float(t["time_dp_comm"][0])

    compute, dp = times(H100)
    assert dp > compute * (1 + H100.efficiency.comm_slowdown)  # link-bound, or no test
    assert times(H100) == pytest.approx(times(FREE))
    # and a plan that is compute-bound still pays the slowdown (test above)


def test_exposed_collectives_slow_nothing() -> None:
    """A runtime that overlaps nothing hides nothing, so nothing is slowed."""
    runtime = dataclasses.replace(load_runtime("torchtitan"), overlap_dp_comm=False,
                                  overlap_param_gather=False)
    plan = _fsdp()
    assert _table(plan, H100, runtime)["time_dp_comm"][0] == pytest.approx(
        _table(plan, FREE, runtime)["time_dp_comm"][0])


def test_comm_slowdown_out_of_range_is_a_clear_error() -> None:
    data = read_yaml(resources.find(resources.PROFILES, "h100-sxm-80gb"), "profile")
    data["efficiency"]["comm_slowdown"] = -0.1
    with pytest.raises(ConfigError, match="comm_slowdown"):
        profile_from_dict(data)


def _tp4(sp: bool) -> Plan:
    return Plan(model="llama-3.1-8b", cluster=ClusterRef("h100-sxm-80gb", 8),
                batch=Batch(1, 16), parallel=Parallel(dp=2, tp=4), sequence_parallel=sp,
                zero_stage=1, precision=Precision.BF16)


def test_userbuffers_pipelined_overlap_runs_its_gemms_on_the_sms_left() -> None:
    """NeMo's H100 recipe keeps 24 SMs for the output projection's reduce-scatter and 16 for
    the MLP's: those forward GEMMs take 132/108 and 132/116 of their time; the backward and
    the other GEMMs are untouched."""
    nemo = load_runtime("nemo")
    assert (nemo.userbuffers_proj_sms, nemo.userbuffers_fc2_sms) == (24, 16)
    none = dataclasses.replace(nemo, userbuffers_proj_sms=0, userbuffers_fc2_sms=0)
    r = rows_of(plan_to_row(_tp4(sp=True), MODEL), MODEL, "bf16", nemo)
    lt = {"gemm_forward": np.array([1.0]), "proj_gemm_forward": np.array([0.1]),
          "fc2_gemm_forward": np.array([0.3])}
    got = block_comm.userbuffers_margin_s(MODEL, H100, nemo, r, lt)
    assert got == pytest.approx([0.1 * (132 / 108 - 1) + 0.3 * (132 / 116 - 1)])
    assert block_comm.userbuffers_margin_s(MODEL, H100, none, r, lt) == pytest.approx([0.0])
    # the whole step: the margin adds forward time only where userbuffers runs (SP, tp >= 2)
    sp_on = _table(_tp4(sp=True), H100, nemo)["time_compute"][0]
    assert sp_on > _table(_tp4(sp=True), H100, none)["time_compute"][0]
    assert _table(_tp4(sp=False), H100, nemo)["time_compute"][0] == pytest.approx(
        _table(_tp4(sp=False), H100, none)["time_compute"][0])


def test_userbuffers_sms_must_be_whole_numbers() -> None:
    with pytest.raises(ConfigError, match="userbuffers_fc2_sms"):
        runtime_from_dict({"schema_version": 1, "base": "nemo", "userbuffers_fc2_sms": 2.5})
