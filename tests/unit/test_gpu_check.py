"""The pure parts of benchmarks/gpu_check.py: profile naming, the steady-state median, which
predicted bytes the measured peak is compared with, errors, MFU and their medians, and that
every plan of the check is one the runtime and the planner accept on one GPU. Nothing here needs
a GPU; the flow itself is exercised by `python benchmarks/gpu_check.py --dry-run`."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.model_spec import load_model
from autoplan.plan import plan_from_dict
from autoplan.plan_rules import validate_plan
from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def gc():
    return load_script("gpu_check")


def test_a_measured_profile_never_takes_an_existing_name(gc, tmp_path: Path) -> None:
    assert gc.fresh_profile_path(tmp_path, "h200-measured") == (
        "h200-measured", tmp_path / "h200-measured.yaml")
    (tmp_path / "h200-measured.yaml").write_text("x")
    assert gc.fresh_profile_path(tmp_path, "h200-measured")[0] == "h200-measured-2"
    (tmp_path / "h200-measured-2.yaml").write_text("x")
    name, path = gc.fresh_profile_path(tmp_path, "h200-measured")
    assert (name, path.name) == ("h200-measured-3", "h200-measured-3.yaml")


def test_steady_median_leaves_out_the_warmup_steps(gc) -> None:
    assert gc.steady_median([9.0, 5.0, 1.0, 3.0, 2.0], warmup=2) == 2.0
    assert gc.steady_median([9.0, 5.0], warmup=2) == 7.0  # too few: every step counts
    assert gc.steady_median([], warmup=2) is None


def test_the_measured_peak_is_compared_with_what_its_api_can_see(gc) -> None:
    memory = {"total": 100.0, "reserved": 20.0, "allocator": 5.0, "params": 40.0}
    assert gc.comparable_memory(memory, "cuda") == 75.0  # max_memory_allocated
    assert gc.comparable_memory(memory, "cpu") == 100.0  # peak RSS holds all of it


def _row(gc, status: str, measured_s: float | None, preds: dict) -> dict:
    est = {k: (None if v is None else {"step_time_s": v[0], "memory_allocated_bytes": v[1]})
           for k, v in preds.items()}
    row = {"status": status, "plan": "p"}
    row.update(gc.compare(measured_s, 200.0, 1e12, 1e13, est))
    return row


def test_errors_mfu_and_their_medians(gc) -> None:
    rows = [
        _row(gc, "complete", 1.0, {"datasheet": (0.5, 100.0), "measured_profile": (1.2, 300.0)}),
        _row(gc, "complete", 2.0, {"datasheet": (3.0, 200.0), "measured_profile": None}),
        _row(gc, "complete", 4.0, {"datasheet": (3.0, 150.0), "measured_profile": (4.4, 180.0)}),
        _row(gc, "failed", None, {"datasheet": (9.0, 1.0), "measured_profile": (9.0, 1.0)}),
    ]
    first = rows[0]
    assert first["errors"]["datasheet"]["step_time"] == pytest.approx(-0.5)
    assert first["errors"]["measured_profile"]["memory"] == pytest.approx(0.5)
    assert first["mfu"]["measured"] == pytest.approx(0.1)  # 1e12 / (1.0 s x 1e13)
    assert first["mfu"]["datasheet"] == pytest.approx(0.2)
    assert rows[3]["errors"]["datasheet"]["step_time"] is None  # nothing measured
    s = gc.summarize(rows)
    assert (s["completed"], s["plans"]) == (3, 4)
    assert s["datasheet"]["n"] == 3
    assert s["datasheet"]["step_time_median_abs_error"] == pytest.approx(0.5)  # .5, .5, .25
    assert s["datasheet"]["memory_median_abs_error"] == pytest.approx(0.25)  # .5, 0, .25
    assert s["measured_profile"]["n"] == 2  # the plan it could not predict is left out
    assert s["measured_profile"]["step_time_median_abs_error"] == pytest.approx(0.15)
    assert s["measured_mfu_median"] == pytest.approx(0.05)  # 0.1, 0.05, 0.025


@pytest.mark.parametrize("index", range(8))
def test_every_plan_of_the_check_is_valid_on_one_gpu(gc, index: int) -> None:
    from autoplan.hardware import ClusterSpec, load_profile
    from autoplan.runtime.validation import check_plan, runtime_problems

    knobs = gc.PLANS[index]
    plan = plan_from_dict(gc.plan_data(str(gc.MODEL_1B), "h200-sxm-141gb", knobs, 8, "bf16"))
    spec = load_model(str(gc.MODEL_1B))
    assert spec.num_layers == 16 and spec.vocab_size == 128256 and spec.tie_embeddings
    problem = gc.runtime_problem(plan)  # fp8 without the GPU or torchao: the only refusal
    if problem is None:
        check_plan(plan, spec, 1)  # the runtime's rules: raises on a plan it cannot run
    else:
        assert runtime_problems(plan, spec) == [problem]
    reasons = validate_plan(plan, spec, ClusterSpec(load_profile("h200-sxm-141gb"), 1))
    assert reasons == []
    assert plan.recompute.policy.value == knobs["recompute"]
    assert plan.offload.optimizer is bool(knobs.get("offload"))
    assert plan.precision.value == knobs.get("precision", "bf16")


def test_the_dry_run_model_is_the_1b_family_in_small(gc) -> None:
    big, small = load_model(str(gc.MODEL_1B)), load_model(str(gc.MODEL_DRY))
    same = ("mlp", "norm", "position", "bias", "tie_embeddings")
    assert [getattr(small, k) for k in same] == [getattr(big, k) for k in same]
    assert small.kv_heads < small.num_heads and big.kv_heads < big.num_heads  # both GQA
    assert small.hidden_size * 16 <= big.hidden_size


def test_the_plans_cover_what_the_issue_asks(gc) -> None:
    policies = {k["recompute"] for k in gc.PLANS}
    sizes = {k["mbs"] for k in gc.PLANS}
    assert policies == {"none", "selective", "full"} and sizes == {1, 2, 4}
    assert any(k.get("offload") for k in gc.PLANS)
    dry = [gc.PLANS[i] for i in gc.DRY_RUN_PLANS]
    assert {k["recompute"] for k in dry} == policies and {k["mbs"] for k in dry} == sizes
    assert any(k.get("offload") for k in dry)
    assert [k for k in gc.PLANS if k.get("precision") == "fp8"] == [
        k for k in dry if k.get("precision") == "fp8"] != []  # issue #12: fp8 on the GPU check


def test_the_fp8_plan_is_skipped_with_the_runtimes_reason_where_it_cannot_run(gc) -> None:
    import torch

    fp8 = next(k for k in gc.PLANS if k.get("precision") == "fp8")
    plan = plan_from_dict(gc.plan_data(str(gc.MODEL_1B), "h200-sxm-141gb", fp8, 8, "bf16"))
    bf16 = plan_from_dict(gc.plan_data(str(gc.MODEL_1B), "h200-sxm-141gb",
                                       {"recompute": "none", "mbs": 2}, 8, "bf16"))
    assert gc.runtime_problem(bf16) is None
    if not torch.cuda.is_available():
        assert "fp8 needs a CUDA GPU" in gc.runtime_problem(plan)

