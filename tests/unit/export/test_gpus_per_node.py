"""`export --gpus-per-node N`: the price and the memory check are of the nodes written, and a
model-parallel group those nodes split is said once (autoplan.export.nodes)."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.export.nodes import split_groups
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import Batch, ClusterRef, Offload, Parallel, Plan, Recompute, RecomputePolicy
from autoplan.plan_files import save_plan

PROFILE = "a100-sxm4-80gb"


def plan(model: str, gpus: int, **kw) -> Plan:
    return Plan(model=model, cluster=ClusterRef(PROFILE, gpus), **kw)


TP8 = plan("gpt3-6.7b", 32, parallel=Parallel(dp=4, tp=8), zero_stage=1,
           recompute=Recompute(RecomputePolicy.FULL), batch=Batch(2, 128))
"""The user's plan: tp 8 fills one node of a100-sxm4-80gb's 8 GPUs; on nodes of 2 it spans 4."""


def export(tmp_path: Path, capsys, caplog, p, *flags: str) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, warnings logged) of `autoplan export` of plan `p`."""
    path = save_plan(p, tmp_path / "plan.yaml", overwrite=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autoplan.export"):
        code = main(["export", str(path), *flags])
    out, err = capsys.readouterr()
    return code, out, err, [r.getMessage() for r in caplog.records]


def step_s(err: str) -> float:
    return float(re.search(r"priced for \S+: step (\S+) s", err).group(1))


def test_the_price_is_of_the_nodes_written(tmp_path: Path, capsys, caplog) -> None:
    code, out, err, warned = export(tmp_path, capsys, caplog, TP8, "--to", "slurm")
    assert code == 0 and "#SBATCH --nodes=4" in out and warned == []
    eight = step_s(err)
    code, out, err, warned = export(tmp_path, capsys, caplog, TP8, "--to", "slurm",
                                    "--gpus-per-node", "2")
    assert code == 0 and "#SBATCH --nodes=16" in out and "--gpus-per-node=2" in out
    two = dataclasses.replace(load_profile(PROFILE), gpus_per_node=2)
    want = estimate_plan(TP8, ClusterSpec(two, 32), TP8.model_spec(), runtime=None)
    assert step_s(err) == float(f"{want.step_time_s:.3g}")
    assert step_s(err) > 1.5 * eight  # tp 8's all-reduces over the inter-node links
    assert len(warned) == 1, warned
    assert warned[0].startswith("--gpus-per-node 2: tp 8 no longer fits inside one node")
    assert "\n" not in warned[0] and f"{PROFILE} has 8 GPUs per node" in warned[0]


@pytest.mark.parametrize("gpus_per_node", ["8", "16"])
def test_no_warning_where_every_group_still_fits(tmp_path: Path, capsys, caplog,
                                                 gpus_per_node: str) -> None:
    code, _, err, warned = export(tmp_path, capsys, caplog, TP8, "--to", "megatron")
    assert code == 0
    code, _, resized, warned = export(tmp_path, capsys, caplog, TP8, "--to", "megatron",
                                      "--gpus-per-node", gpus_per_node)
    assert code == 0 and not any("no longer fit" in w for w in warned)
    if gpus_per_node == "8":  # the profile's own size: the same price, nothing to say
        assert step_s(resized) == step_s(err) and warned == []
    else:  # larger nodes than any the profile describes: said once
        assert warned == [f"--gpus-per-node 16: nodes larger than {PROFILE}'s 8 GPUs, priced "
                          "with its intra-node links across 16 GPUs and its host memory per "
                          "node, which describe no such node; measure one (`autoplan profile`) "
                          "or give a profile of it to price it"]


def test_split_groups_names_each_model_parallel_group_a_node_size_splits() -> None:
    cp = plan("llama-3-8b", 16, parallel=Parallel(dp=2, tp=4, cp=2), batch=Batch(1, 16))
    assert split_groups(cp, 8, 8) == []
    assert split_groups(cp, 8, 4) == ["tp 4 x cp 2"]  # tp 4 still fits a node of 4
    assert split_groups(cp, 8, 2) == ["tp 4", "tp 4 x cp 2"]
    assert split_groups(cp, 4, 2) == ["tp 4"]  # tp x cp spanned two nodes already
    moe = plan("mixtral-8x7b", 16, parallel=Parallel(dp=16, ep=8), batch=Batch(1, 16))
    assert split_groups(moe, 8, 4) == ["ep 8 x etp 1"]
    assert split_groups(moe, 8, 16) == []


def test_the_memory_check_is_of_the_nodes_written(tmp_path: Path, capsys, caplog) -> None:
    """Host memory is per node: offloaded states of 8 ranks overflow one node's 2 TiB, those
    of 4 do not."""
    offload = plan("gpt3-175b", 8, parallel=Parallel(dp=8), zero_stage=3,
                   offload=Offload(optimizer=True, params=True),
                   recompute=Recompute(RecomputePolicy.FULL), batch=Batch(1, 32))
    code, _, err, _ = export(tmp_path, capsys, caplog, offload, "--to", "torchrun")
    assert code == 3 and "of host memory per node" in err
    code, out, err, _ = export(tmp_path, capsys, caplog, offload, "--to", "torchrun",
                               "--gpus-per-node", "4")
    assert code == 0 and "--nproc-per-node=4" in out, err
    code, _, err, _ = export(tmp_path, capsys, caplog, offload, "--to", "torchrun",
                             "--gpus-per-node", "16")
    assert code == 3 and f"8 x {PROFILE} on nodes of 16 GPUs" in err
