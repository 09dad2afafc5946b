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
