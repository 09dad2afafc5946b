"""An export refused for a knob the target's engine lacks names the concrete fix (user test 37,
finding 9): a search with the `--runtime` that keeps to what the target runs, and the `--set`
edit that makes this plan expressible; where no search or edit helps (a model the target cannot
build), neither is offered."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.cost.runtime_rules import refusals
from autoplan.cost.runtimes import load_runtime
from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.export.base import ExportOptions, export_plan, plan_reasons
from autoplan.export.pricing import check_fits
from autoplan.export.refusal_fix import plan_edits
from autoplan.export.registry import get_target
from autoplan.plan import Batch, Parallel, Precision, Recompute, RecomputePolicy, plan_from_dict
from autoplan.plan_files import plan_to_dict, save_plan
from autoplan.plan_sets import apply_sets
from autoplan.search.cli import RUNTIMES
from tests.cli_refusals import assert_refused

from .cases import CASES, FULL, plan

LLAMA_ZERO1 = plan("llama-3.1-8b", 16, zero_stage=1, recompute=FULL)
"""torchtitan builds Llama 3.1 8B, but has no ZeRO-1 (it runs 0, 2, 3); with full recompute
it fits at ZeRO-2 (without, ZeRO-2 needs 94.2 GiB as torchtitan holds it, and the memory
check refused the edit offered)."""


@pytest.mark.parametrize(("fmt", "runtime", "out"), [("toml", "torchtitan", "job.toml"),
                                                     ("python", "torchtitan-0.3", "job.py")])
def test_a_torchtitan_refusal_says_which_search_and_which_set_give_a_plan_it_runs(
        tmp_path: Path, capsys, fmt, runtime, out):
    plan_file = tmp_path / "plan.yaml"
    save_plan(LLAMA_ZERO1, plan_file)
    assert runtime in RUNTIMES  # a name `search --runtime` takes
    err = assert_refused(capsys, ["export", str(plan_file), "--to", "torchtitan", "--out",
                                  str(tmp_path / out)],
                         f"runtime {runtime} has no ZeRO stage 1",
                         f"search again with --runtime {runtime}",
                         "set zero_stage=2 in the plan",
                         f"autoplan estimate --plan {plan_file} --runtime {runtime} --set "
                         "zero_stage=2")
    assert "pick another target" not in err
    assert not (tmp_path / out).exists()


def test_the_set_offered_makes_the_plan_export(tmp_path: Path):
    """The edit is no guess: applied as estimate applies --set, the export goes through."""
    target, opts = get_target("torchtitan"), ExportOptions(torchtitan_format="toml")
    model = LLAMA_ZERO1.model_spec()
    edits = plan_edits(target, LLAMA_ZERO1, model, opts)
    assert edits == ["zero_stage=2"]
    data = plan_to_dict(LLAMA_ZERO1)
    apply_sets(data, edits)
    assert export_plan(target, plan_from_dict(data), model, opts)
    assert not refusals(plan_from_dict(data), load_runtime("torchtitan"), model)


def test_two_edits_are_offered_where_one_is_not_enough():
    """tp 2 at ZeRO-0 for torchtitan 0.2.2: DDP beside tp, and tp without sequence parallelism,
    two refusals that no single field lifts."""
    two = plan("llama-3.1-8b", 8, parallel=Parallel(dp=4, tp=2), zero_stage=0)
    target, opts = get_target("torchtitan"), ExportOptions(torchtitan_format="toml")
    edits = plan_edits(target, two, two.model_spec(), opts)
    assert sorted(edits) == ["sequence_parallel=true", "zero_stage=2"]


def test_a_launcher_refusal_names_autoplans_runtime(tmp_path: Path, capsys):
    """A plan searched for Megatron-LM (fp8 beside tp 2, which autoplan's runtime does not
    train) exported to a launcher: the search to run is autoplan's own, the edit bf16."""
    fp8_tp = plan("llama-3.1-8b", 16, parallel=Parallel(dp=8, tp=2), sequence_parallel=True,
                  zero_stage=1, precision=Precision.FP8)
    plan_file = tmp_path / "plan.yaml"
    save_plan(fp8_tp, plan_file)
    assert_refused(capsys, ["export", str(plan_file), "--to", "torchrun"],
                   "precision fp8 with tp=2", "search again with --runtime autoplan",
                   "set precision=bf16 in the plan")


def test_no_search_or_edit_is_offered_for_a_model_the_target_cannot_build():
    """gpt3-1.3b: torchtitan builds Llama 3 only, so neither a search for its runtime nor a
    plan edit gets an exportable plan."""
    case = CASES["dp-zero1"][0]
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("torchtitan"), case, case.model_spec(),
                    ExportOptions(torchtitan_format="toml"), "torchtitan")
    assert "runtime torchtitan has no ZeRO stage 1" in err.value.problem
    assert err.value.fix == "change the plan or pick another target"


def test_the_plan_rules_keep_their_own_fix():
    case = CASES["sp-without-tp"][0]
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("slurm"), case, case.model_spec(), ExportOptions(), "autoplan")
    assert err.value.fix.startswith("fix the plan")


def test_main_exit_code_is_two(tmp_path: Path, capsys):
    plan_file = tmp_path / "plan.yaml"
    save_plan(LLAMA_ZERO1, plan_file)
    assert main(["export", str(plan_file), "--to", "torchtitan"]) == 2
    assert not capsys.readouterr().out


def _fp8_70b(**kw):
    """llama-3-70b on 64 H100s at tp 2 in fp8, as `search --runtime megatron` may give it:
    autoplan's runtime does not train fp8 beside tp; in bf16 it holds twice the weights."""
    return plan("llama-3-70b", 64, parallel=Parallel(dp=32, tp=2), sequence_parallel=True,
                precision=Precision.FP8, batch=Batch(micro_batch_size=1, global_batch_size=256),
                **kw)


def test_an_edit_that_would_run_out_of_memory_is_not_offered(tmp_path: Path, capsys):
    """precision=bf16 lifts torchrun's refusal of ZeRO-1's fp8 plan, but the export's memory
    check then refused it (exit 3): the suggested --set must pass that check too."""
    target, opts = get_target("torchrun"), ExportOptions()
    fp8 = _fp8_70b(zero_stage=1)
    model = fp8.model_spec()
    bf16 = fp8.replace(precision=Precision.BF16)
    assert not plan_reasons(bf16, model) and not target.check(bf16, model, opts)
    with pytest.raises(InfeasiblePlanError, match="does not fit"):
        check_fits("plan.yaml", bf16, model, None, opts.gpus_per_node)
    assert plan_edits(target, fp8, model, opts, "autoplan") == []
    plan_file = tmp_path / "plan.yaml"
    save_plan(fp8, plan_file)
    err = assert_refused(capsys, ["export", str(plan_file), "--to", "torchrun"],
                         "precision fp8 with tp=2")
    assert "precision=bf16" not in err


def test_an_edit_offered_passes_the_memory_check_too():
    target, opts = get_target("torchrun"), ExportOptions()
    fp8 = _fp8_70b(zero_stage=3, recompute=Recompute(RecomputePolicy.FULL))
    model = fp8.model_spec()
    assert plan_edits(target, fp8, model, opts, "autoplan") == ["precision=bf16"]
    check_fits("plan.yaml", fp8.replace(precision=Precision.BF16), model, None,
               opts.gpus_per_node)  # raises where it does not fit
