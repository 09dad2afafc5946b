"""The runtime's refusal of a plan (autoplan.runtime.validation.check_plan): its fix names
--nproc only where the launched process count is one of the problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import Batch, ClusterRef, Offload, Parallel, Plan, Precision
from autoplan.plan_files import save_plan
from autoplan.runtime.validation import check_plan


def cpu_plan(gpus: int = 2, **kw) -> Plan:
    kw.setdefault("parallel", Parallel(dp=gpus))
    return Plan(model="tiny", cluster=ClusterRef("cpu-gloo", gpus), batch=Batch(1, 2), **kw)


def refusal(plan: Plan, world_size: int | None) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        check_plan(plan, plan.model_spec(), world_size)
    return err.value


def test_train_of_an_fp8_plan_on_a_cpu_profile_does_not_mention_nproc(tmp_path: Path,
                                                                     capsys) -> None:
    path = save_plan(cpu_plan(1, precision=Precision.FP8), tmp_path / "plan.yaml")
    assert main(["train", str(path), "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "precision fp8 needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1, err
    assert "--nproc" not in err and err.rstrip().endswith("; fix the plan"), err


def test_a_plan_problem_alone_asks_for_a_fixed_plan() -> None:
    bad = cpu_plan(zero_stage=1, offload=Offload(params=True))
    err = refusal(bad, bad.world_size)
    assert "offload.params=true needs zero_stage=3" in err.problem
    assert err.fix == "fix the plan" and "--nproc" not in str(err)


def test_a_process_count_alone_asks_for_a_matching_nproc() -> None:
    err = refusal(cpu_plan(), 1)
    assert err.problem == "world size 1 != plan's dp*tp*pp*cp = 2*1*1*1 = 2"
    assert err.fix.startswith("pass --nproc 2 ") and err.fix.endswith("re-plan for 1 process")


def test_both_ask_for_both() -> None:
    err = refusal(cpu_plan(zero_stage=1, offload=Offload(params=True)), 1)
    assert err.problem.startswith("world size 1 != ") and "offload.params" in err.problem
    assert err.fix.startswith("fix the plan, and pass --nproc 2 ")
