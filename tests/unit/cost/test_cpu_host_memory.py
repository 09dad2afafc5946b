"""A CPU profile's ranks are processes sharing one host: estimate and search hold a plan's
ranks to the profile's host memory, as `autoplan train` holds them to this host's
(runtime/launch.host_preflight), so search no longer recommends what train refuses."""

from __future__ import annotations

import numpy as np

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.step_memory import node_host_bytes
from autoplan.hardware import load_profile
from autoplan.plan import plan_from_dict
from autoplan.runtime.launch import cpu_ranks_bytes


def _plan(num_gpus: int) -> object:
    return plan_from_dict({
        "model": {"name": "gpt3-125m-768", "num_layers": 12, "hidden_size": 768,
                  "num_heads": 12, "vocab_size": 50257, "seq_len": 768, "tie_embeddings": True},
        "cluster": {"profile": "cpu-gloo", "num_gpus": num_gpus},
        "parallel": {"dp": num_gpus}, "zero_stage": 0, "precision": "fp32",
        "attention": "eager", "batch": {"micro_batch_size": 1, "global_batch_size": num_gpus}})


def test_cpu_ranks_that_overfill_the_host_are_refused_with_the_shortfall() -> None:
    cpu = load_profile("cpu-gloo")
    one = estimate_plan(_plan(1))
    assert one.feasible and one.memory["total"] <= cpu.device.memory_bytes
    eight = estimate_plan(_plan(8))
    per_rank = eight.memory["total"]
    assert per_rank <= cpu.device.memory_bytes  # each rank alone fits its 4 GiB budget
    assert 8 * per_rank > cpu.host.memory_bytes  # eight of them do not fit the 24 GiB host
    assert not eight.feasible
    [reason] = [r for r in eight.reasons if "host memory" in r]
    assert reason.startswith("its ranks need") and "short by" in reason


def test_the_estimate_and_trains_host_check_count_the_same_bytes() -> None:
    plan = _plan(4)
    need, _ = cpu_ranks_bytes(plan, plan.model_spec(), 4)
    est = estimate_plan(plan)
    counted = node_host_bytes(load_profile("cpu-gloo"), est.memory["total"],
                              est.memory["host_total"], 4)
    assert float(counted) == need


def test_a_gpu_profile_counts_only_offloaded_states_on_the_host() -> None:
    gpu = load_profile("a100-sxm4-80gb")
    assert float(node_host_bytes(gpu, 70e9, 0.0, 64)) == 0.0
    assert float(node_host_bytes(gpu, 70e9, 10e9, 64)) == 80e9  # 8 GPUs per node
    assert np.allclose(node_host_bytes(gpu, np.array([1.0, 2.0]), np.array([1.0, 2.0]), 4),
                       [4.0, 8.0])


def test_a_shortfall_under_a_twentieth_of_a_gib_reads_in_mib() -> None:
    from autoplan.cost.estimate import short_by

    assert short_by(6.6 * 2**20) == "7 MiB"  # was "short by 0.0 GiB"
    assert short_by(3.25 * 2**30) == "3.2 GiB"
