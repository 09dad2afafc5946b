"""search's exit-3 line names every knob of the nearest miss that its memory depends on, so
`estimate --set ...` with them prices the figure it prints (a user test could not reproduce
"needs 64.7 GiB": ZeRO-3 and offload were not named)."""

from __future__ import annotations

import dataclasses

from autoplan.plan import Offload, Recompute, RecomputePolicy, plan_from_dict
from autoplan.plan_files import plan_to_dict
from autoplan.search.summary import infeasible_line, table_infeasible_line


def test_the_nearest_miss_names_zero_offload_and_recompute() -> None:
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": 3,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    plan = dataclasses.replace(plan, offload=Offload(optimizer=True, params=True),
                               recompute=Recompute(policy=RecomputePolicy.FULL))
    data = {"counts": {"out-of-memory": 3, "feasible": 0}, "candidates": 3,
            "nearest": {"reason": "out-of-memory", "plan": plan_to_dict(plan),
                        "misses": ["needs 64.7 GiB of 39.6 GiB per GPU"]}}
    line = infeasible_line(data)
    assert ("nearest (out-of-memory) (as estimate --set) parallel.dp=8 parallel.tp=1 "
            "parallel.pp=1 parallel.cp=1 batch.micro_batch_size=1 batch.global_batch_size=8 "
            "precision=bf16 attention=flash zero_stage=3 offload.optimizer=true "
            "offload.params=true "
            "recompute.policy=full: needs 64.7 GiB") in line


def test_a_multi_type_miss_names_its_gpu_type_once() -> None:
    """Across GPU types the miss leads with its type ("on 8 x P, needs ..."), which the line
    has named before the knobs: said once, and the figure follows the knobs directly."""
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 8},
                           "parallel": {"dp": 8},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    data = {"cluster": "cpu-gloo,other", "counts": {"host-memory": 1, "feasible": 0},
            "candidates": 1,
            "nearest": {"reason": "host-memory", "plan": plan_to_dict(plan),
                        "misses": ["on 8 x cpu-gloo, needs 60.0 GiB of host memory",
                                   "too slow"]}}
    line = infeasible_line(data)
    assert line.count("on 8 x cpu-gloo") == 1
    assert "nearest (host-memory) on 8 x cpu-gloo (as estimate --set) parallel.dp=8" in line
    assert line.endswith("attention=flash: needs 60.0 GiB of host memory; too slow")


def test_the_table_mode_line_says_where_the_miss_is_and_the_gpu_range_to_try() -> None:
    """In table mode stdout shows the nearest miss; stderr (all a terminal shows with
    `--format table > FILE`) says it is on stdout, not "above", and keeps the --num-gpus range
    to search next, without the figures behind it."""
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 8},
                           "parallel": {"dp": 8},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    near = {"reason": "out-of-memory", "plan": plan_to_dict(plan),
            "misses": ["needs 64.7 GiB of 39.6 GiB per GPU"]}
    data = {"counts": {"out-of-memory": 3, "feasible": 0}, "candidates": 3, "nearest": near}
    assert table_infeasible_line(data) == ("no feasible plan among 3 candidates; the nearest "
                                           "miss (out-of-memory) and what to try are on stdout")
    near["more_gpus"] = {"num_gpus": "16..128", "from": 8, "short": 0.63, "proportional": 13.1}
    assert table_infeasible_line(data) == (
        "no feasible plan among 3 candidates; the nearest miss (out-of-memory) is on stdout; "
        "to find the fewest GPUs that fit: try --num-gpus 16..128 --objective gpus")
    assert "misses by 1.63x" in infeasible_line(data)  # the JSON mode's line keeps the figures
