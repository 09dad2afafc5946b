"""fp8 plans: refused in one line where the machine cannot run them (this CPU machine)."""

from __future__ import annotations

import pytest

from autoplan.model_spec import PRESETS
from autoplan.plan import plan_from_dict
from autoplan.runtime.float8 import fp8_problem
from autoplan.runtime.validation import runtime_problems

torch = pytest.importorskip("torch")

FP8 = {"model": "tiny-llama", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 1},
       "precision": "fp8", "batch": {"micro_batch_size": 2, "global_batch_size": 4}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine may run fp8")
def test_fp8_is_refused_without_a_cuda_gpu() -> None:
    plan = plan_from_dict(FP8)
    problem = fp8_problem(plan)
    assert problem is not None and "CUDA" in problem and "\n" not in problem
    assert problem in runtime_problems(plan, PRESETS["tiny-llama"])


def test_bf16_plans_have_no_fp8_problem() -> None:
    assert fp8_problem(plan_from_dict({**FP8, "precision": "bf16"})) is None


def test_fp8_with_tp_is_refused_once_by_the_shared_rule() -> None:
    """fp8 beside tp > 1 was refused twice on a CUDA machine (float8.fp8_problem and the plan
    rule runtime-fp8-tp); the one rule search also applies now says it, once."""
    plan = plan_from_dict({**FP8, "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 2},
                           "parallel": {"tp": 2}})
    problems = runtime_problems(plan, PRESETS["tiny-llama"])
    assert sum("tp=2" in p and "fp8" in p for p in problems) == 1


def test_train_holds_a_plan_to_the_rules_search_holds_its_runtime_to(monkeypatch) -> None:
    """`autoplan train` judges a plan by the runtime-traits rules search and estimate apply to
    autoplan's runtime (cost/runtime_rules.refusals), not by a list of its own: were the traits
    to lack a schedule, train would refuse a plan using it as search does."""
    from dataclasses import replace

    from autoplan.cost import runtimes

    real = runtimes.load_runtime

    def narrowed(ref=None, flag="--runtime", on_cpu=False):
        return replace(real(ref, flag, on_cpu), schedules=("1f1b",))

    monkeypatch.setattr(runtimes, "load_runtime", narrowed)
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"pp": 2}, "pipeline": {"schedule": "gpipe"},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 4}})
    assert any("gpipe" in p for p in runtime_problems(plan, PRESETS["tiny"]))
