"""Review fix in runtime/launch.py (host_preflight): `autoplan train` refuses, before any rank
starts, a plan this host cannot hold. The README's 64-rank gpt3-13b plan for A100s passed the
memory check (priced on the A100's 80 GiB) and spawned 64 ranks on a 2-core, 23 GiB CPU host
with only the ranks' device-mismatch warning. A small plan of another device still trains."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import load_profile
from autoplan.plan import ClusterRef, plan_from_dict
from autoplan.plan_files import save_plan
from tests.dist.parity import make_plan
from tests.unit.runtime.test_review_fixes_train_cli import FakeLaunch

GIB = 2**30
REVIEW_HOST = int(23.5 * GIB)
GPT13B = {"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
          "batch": {"micro_batch_size": 4, "global_batch_size": 512},
          "parallel": {"dp": 32, "tp": 2}, "sequence_parallel": True, "zero_stage": 1,
          "precision": "bf16"}
"""The plan `autoplan search --model gpt3-13b --cluster a100-sxm4-80gb --num-gpus 64` gave."""


@pytest.fixture
def launch(monkeypatch):
    fake = FakeLaunch()
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", fake)
    return fake


def _host(monkeypatch, nbytes: int) -> None:
    monkeypatch.setattr("autoplan.runtime.machine.host_memory_bytes", lambda: nbytes)


def _refused(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1 and not captured.out, err
    for needle in needles:
        assert needle in err, err
    return err


def test_the_readme_gpu_plan_is_refused_on_a_cpu_host_before_launch(tmp_path, capsys,
                                                                    monkeypatch, launch):
    _host(monkeypatch, REVIEW_HOST)
    plan = str(save_plan(plan_from_dict(GPT13B), tmp_path / "plan.yaml"))
    err = _refused(capsys, ["train", plan, "--steps", "2", "--backend", "gloo"],
                   "does not fit this host: 64 ranks on cpu (gloo) need ",
                   "as autoplan-cpu holds them", "this host has 23.5 GiB (short by ",
                   "a100-sxm4-80gb", "--no-memory-check")
    assert launch.commands == [], err
    need = float(err.split(" need ")[1].split(" GiB")[0])
    assert need > 64 * 40  # tens of GiB per rank, not the 80 GiB device's verdict


def test_no_memory_check_still_launches_it(tmp_path, capsys, monkeypatch, launch):
    _host(monkeypatch, REVIEW_HOST)
    plan = str(save_plan(plan_from_dict(GPT13B), tmp_path / "plan.yaml"))
    assert main(["train", plan, "--steps", "2", "--backend", "gloo", "--no-memory-check",
                 "--format", "json"]) == 0, capsys.readouterr().err
    assert len(launch.commands) == 1


def test_a_small_gpu_profile_plan_that_fits_still_trains_here(tmp_path, capsys, monkeypatch,
                                                              launch):
    """test_cli_train's case: the ranks warn (device_mismatch) and the run record is written."""
    _host(monkeypatch, 2 * GIB)
    gpu_plan = dataclasses.replace(make_plan(), cluster=ClusterRef("a100-sxm4-80gb", 1))
    plan = str(save_plan(gpu_plan, tmp_path / "a100.yaml"))
    assert main(["train", plan, "--steps", "3", "--backend", "gloo", "--format", "json"]) == 0, \
        capsys.readouterr().err
    assert len(launch.commands) == 1


def test_ranks_that_each_fit_but_not_together_are_refused(tmp_path, capsys, monkeypatch,
                                                          launch):
    """The per-rank check passes (well under cpu-gloo's 4 GiB); the ranks share the host."""
    from autoplan.runtime.launch import cpu_ranks_bytes

    plan = make_plan(dp=4)
    total, per_rank = cpu_ranks_bytes(plan, plan.model_spec(), 4)
    assert total == pytest.approx(4 * per_rank)
    _host(monkeypatch, int(3 * per_rank))
    path = str(save_plan(plan, tmp_path / "plan.yaml"))
    _refused(capsys, ["train", path, "--steps", "2", "--backend", "gloo"],
             "4 ranks on cpu (gloo) need ", "short by ")
    assert launch.commands == []
    _host(monkeypatch, int(5 * per_rank))
    assert main(["train", path, "--steps", "2", "--backend", "gloo", "--format", "json"]) == 0
    assert len(launch.commands) == 1


def test_a_cpu_rank_is_priced_with_a_cpu_ranks_reserve():
    from autoplan.runtime.launch import cpu_ranks_bytes

    cpu_plan = make_plan()
    gpu_plan = dataclasses.replace(cpu_plan, cluster=ClusterRef("a100-sxm4-80gb", 1))
    _, cpu_rank = cpu_ranks_bytes(cpu_plan, cpu_plan.model_spec(), 1)
    assert cpu_rank == pytest.approx(estimate_plan(cpu_plan).memory_total_bytes)
    _, gpu_rank = cpu_ranks_bytes(gpu_plan, gpu_plan.model_spec(), 1)
    reserve = load_profile("cpu-gloo").device.reserved_bytes
    assert reserve < gpu_rank < reserve + 64 * 2**20  # not the A100's 2 GiB of CUDA context
    total, _ = cpu_ranks_bytes(cpu_plan, cpu_plan.model_spec(), 3)  # elastic: 2 idle ranks
    assert total == pytest.approx(cpu_rank + 2 * reserve)


@pytest.mark.parametrize("memory_check", [[], ["--no-memory-check"]], ids=["check", "no-check"])
def test_more_nccl_ranks_than_gpus_are_refused(tmp_path, capsys, monkeypatch, launch,
                                               memory_check):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("autoplan.runtime.machine.local_gpu_count", lambda: 1)
    path = str(save_plan(make_plan(dp=2), tmp_path / "plan.yaml"))
    _refused(capsys, ["train", path, "--steps", "2", *memory_check],
             "needs 2 ranks, one per GPU, but this node has 1 CUDA GPU(s) (short by 1)",
             "autoplan export")
    assert launch.commands == []
    monkeypatch.setattr("autoplan.runtime.machine.local_gpu_count", lambda: 2)
    _host(monkeypatch, 1)  # NCCL ranks do not live in host memory
    assert main(["train", path, "--steps", "2", "--format", "json", *memory_check]) == 0, \
        capsys.readouterr().err
    assert len(launch.commands) == 1
