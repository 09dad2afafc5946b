"""`autoplan estimate` and `autoplan clusters`: non-finite numbers refused, a flag and a `--set`
that disagree refused, JSON output that is JSON, and one broken user profile skipped with a
warning instead of breaking the listing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from autoplan.cli_common import emit
from autoplan.commands import main
from autoplan.hardware import PROFILES_DIR
from tests.cli_refusals import assert_refused

ESTIMATE = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "8",
            "--format", "json"]


_refused = assert_refused


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_train_tokens_must_be_a_positive_finite_number(capsys, value: str) -> None:
    with pytest.raises(SystemExit) as exit_:  # the flag's type refuses it (cli_common.amount)
        main([*ESTIMATE, "--train-tokens", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"--train-tokens: got {value!r}" in err and "e.g. 1e12 or 1T" in err


@pytest.mark.parametrize(("flags", "needle"), [
    (["--set", "cluster.num_gpus=16"], "--num-gpus: got 8 but --set cluster.num_gpus=16"),
    (["--set", "cluster.profile=a100-sxm4-80gb"],
     "--cluster: got 'cpu-gloo' but --set cluster.profile='a100-sxm4-80gb'"),
    (["--set", "cluster={profile: cpu-gloo, num_gpus: 4}"], "--num-gpus: got 8"),
    (["--set", "model=gpt3-125m"], "--model: got 'tiny'"),
    (["--global-batch-size", "16", "--set", "batch.global_batch_size=32"],
     "--global-batch-size: got 16"),
])
def test_a_flag_and_a_set_that_disagree_are_refused(capsys, flags, needle) -> None:
    _refused(capsys, [*ESTIMATE, *flags], needle, "drop one, or give them the same value")


def test_a_flag_and_a_set_that_agree_are_fine(capsys) -> None:
    assert main([*ESTIMATE, "--set", "cluster.num_gpus=8", "--set", "cluster.profile=cpu-gloo"]
                ) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["cluster"]["num_gpus"] == 8


@pytest.mark.parametrize(("profile", "model", "gpus", "precision"),
                         [("v100-sxm2-32gb", "gpt3-1.3b", "8", "fp16"),
                          ("a100-sxm4-80gb", "gpt3-1.3b", "8", "bf16"),
                          ("cpu-gloo", "tiny", "2", "fp32")])
def test_the_default_plan_takes_a_precision_the_device_has(capsys, profile, model, gpus,
                                                           precision) -> None:
    """Without --plan the plan is autoplan's own default: on a V100, which has no bf16 peak, it
    trains in fp16 rather than being refused for a precision the user never chose; on a CPU in
    fp32, as the search settles `precision: auto` there (its bf16 peak exists, but bf16 matmuls
    run slower), not in the bf16 the CPU profile also lists."""
    assert main(["estimate", "--model", model, "--cluster", profile, "--num-gpus", gpus,
                 "--global-batch-size", "64", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["precision"] == precision
    # a precision the user asks for is theirs, and refused where the device lacks it
    _refused(capsys, ["estimate", "--model", "gpt3-1.3b", "--cluster", "v100-sxm2-32gb",
                      "--num-gpus", "8", "--global-batch-size", "64", "--set", "precision=bf16"],
             "precision=bf16 is not supported by V100-SXM2-32GB")


def test_json_output_never_holds_nan(capsys) -> None:
    # a diverged run's final loss is NaN; JSON has no NaN, so it is written as null
    emit(argparse.Namespace(format="json"), {"final_loss": float("nan"), "x": [float("inf")]},
         lambda console: None)
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert json.loads(out) == {"final_loss": None, "x": [None]}


def test_one_broken_user_profile_is_skipped_with_a_warning(tmp_path: Path, monkeypatch,
                                                           capsys) -> None:
    mine = yaml.safe_load((PROFILES_DIR / "cpu-gloo.yaml").read_text())
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**mine, "name": "mine"}))
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    assert main(["clusters", "--format", "json"]) == 0
    captured = capsys.readouterr()
    names = [row["name"] for row in json.loads(captured.out)]
    assert "mine" in names and "cpu-gloo" in names and "broken" not in names
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "warning" in err, err
    assert str(tmp_path / "broken.yaml") in err and "--cluster" not in err


PLAN_BASE = "model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 2}\nparallel: {dp: 2}\n"


@pytest.mark.parametrize(("batch", "needle"), [
    ('batch: "64"\n', "batch: got '64'"),
    ("batch: [1, 2]\n", "batch: got [1, 2]"),
    ("batch: null\n", "batch: got None"),
    ("", "batch.micro_batch_size: missing"),
    ("batch: {micro_batch_size: 2}\n", "batch.global_batch_size: missing"),
])
def test_a_plan_files_batch_is_checked_as_train_checks_it(tmp_path, capsys, batch, needle):
    """estimate --plan priced a default batch (1 x dp) for a missing or malformed one, which
    train refuses for the same file."""
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN_BASE + batch)
    _refused(capsys, ["estimate", "--plan", str(plan)], needle)


def test_a_plan_file_missing_its_batch_can_take_it_from_the_flags(tmp_path, capsys) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN_BASE)
    assert main(["estimate", "--plan", str(plan), "--global-batch-size", "8",
                 "--micro-batch-size", "2", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)["plan"]["batch"]
    assert got == {"micro_batch_size": 2, "global_batch_size": 8}


def test_the_estimate_of_a_changed_plan_drops_the_files_old_prediction(tmp_path, capsys):
    """A plan search wrote carries its `predicted` block; estimate --set changes the plan and
    prints its own prediction, never the file's stale one beside it."""
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN_BASE + "batch: {micro_batch_size: 1, global_batch_size: 2}\n"
                    "predicted: {step_time_s: 123.0, memory_bytes: 1.0}\n")
    assert main(["estimate", "--plan", str(plan), "--set", "recompute.policy=full",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "predicted" not in out["plan"] and out["plan"]["recompute"]["policy"] == "full"


def test_an_empty_plan_path_is_refused_not_ignored(capsys) -> None:
    _refused(capsys, ["estimate", "--plan", "", "--model", "tiny", "--cluster", "cpu-gloo",
                      "--num-gpus", "2"], "--plan: got an empty path")


GPT3_TIGHT = ["estimate", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
              "1024", "--runtime", "megatron", "--global-batch-size", "1536",
              "--micro-batch-size", "2", "--set", "parallel.dp=32", "--set", "parallel.tp=4",
              "--set", "parallel.pp=8", "--set", "pipeline.schedule=interleaved-1f1b", "--set",
              "pipeline.vpp=12", "--set", "sequence_parallel=true", "--set", "zero_stage=1",
              "--set", "attention=flash"]


def test_a_plan_that_fits_only_at_the_median_allocator_slack_is_called_tight(capsys) -> None:
    """The main job's winner (GPT-3 175B, tp4 pp8 v12, no recompute: ~78 of 79 GiB) fits with
    the allocator slack priced, not with its 75th percentile: feasible (exit 0) and `tight`, in
    the JSON (memory.tight_by, bytes) and in one line of the table; a roomy plan is not."""
    assert main([*GPT3_TIGHT, "--format", "json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    from autoplan.cost import memory

    assert 0.0 < mem["tight_by"] < 0.05 * mem["capacity"] and mem["total"] <= mem["capacity"]
    at_p75 = float(memory.total_at_p75(mem["total"], mem["allocator"]))
    assert mem["capacity"] + mem["tight_by"] == pytest.approx(at_p75, rel=1e-12)
    assert main([*GPT3_TIGHT, "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "tight:" in table and "75th percentile" in table
    assert main([*GPT3_TIGHT, "--set", "recompute.policy=full", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["tight_by"] == 0.0


def test_an_fp8_plans_mfu_names_its_peak(capsys, monkeypatch) -> None:
    """MFU is against the plan precision's dense peak; for fp8 (twice bf16's) the line says so."""
    monkeypatch.setenv("COLUMNS", "200")
    job = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-sxm-80gb", "--num-gpus",
           "8", "--global-batch-size", "64", "--format", "table"]
    main([*job, "--set", "precision=fp8"])
    assert "(of the fp8 peak)" in capsys.readouterr().out
    main(job)
    assert "fp8 peak" not in capsys.readouterr().out


def test_the_clusters_table_prints_three_significant_digits() -> None:
    """A measured profile's 0.941905 GB/s and 0.144557 TFLOP/s widened the table until the
    device names were cut at 80 columns."""
    from autoplan.estimate_cli import three

    assert [three(x) for x in (0.941905, 0.144557, 25.0, 312.0, 6.25, 912.4)] == [
        "0.942", "0.145", "25", "312", "6.25", "912"]
