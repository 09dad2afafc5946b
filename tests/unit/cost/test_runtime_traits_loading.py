"""`--runtime` as the command line loads it: what a traits file is called, which device
`autoplan` means, and one-line errors (exit 2) for a bad base, name, path or field."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan, estimate_table
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_table import plan_to_row

TINY = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
        "--global-batch-size", "8"]
LLAMA8B = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
           "parallel": {"dp": 8}, "zero_stage": 1,
           "batch": {"micro_batch_size": 1, "global_batch_size": 64}}


def refused(capsys, runtime: str) -> str:
    """The one-line error `estimate --runtime <runtime>` exits 2 with."""
    assert main([*TINY, "--runtime", runtime]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def priced_for(capsys, runtime: str) -> str:
    """The runtime `estimate --format json` says it priced for (the cpu profile's fp32 plan is
    one Transformer Engine refuses: exit 3, the estimate printed all the same)."""
    assert main([*TINY, "--runtime", runtime, "--format", "json"]) in (0, 3)
    return json.loads(capsys.readouterr().out)["runtime"]


@pytest.mark.parametrize("base, shown", [("[megatron]", "['megatron']"),
                                         ("{megatron: 1}", "{'megatron': 1}")])
def test_a_base_that_is_not_a_preset_name_is_refused(capsys, tmp_path, base, shown) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"base: {base}\n")
    err = refused(capsys, str(path))
    assert f"--runtime.base: got {shown}; choose one of megatron," in err


def test_autoplan_means_autoplans_runtime_on_the_profiles_device(capsys) -> None:
    assert priced_for(capsys, "autoplan") == "autoplan-cpu"
    cpu = load_profile("cpu-gloo")
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2}, "precision": "fp32",
                           "batch": {"micro_batch_size": 4, "global_batch_size": 8}})
    assert estimate_plan(plan, runtime="autoplan").runtime == "autoplan-cpu"
    row = plan_to_row(plan, plan.model_spec())
    named = estimate_table(row, plan.model_spec(), cpu, "fp32", runtime="autoplan")
    default = estimate_table(row, plan.model_spec(), cpu, "fp32")
    assert named["time_step"][0] == default["time_step"][0]
    assert named["mem_total"][0] == default["mem_total"][0]


def test_a_file_that_customises_a_preset_is_not_labelled_as_the_preset(capsys, tmp_path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: megatron\ngrad_bytes_bf16: 2.0\n")
    assert priced_for(capsys, str(mine)) == "megatron+mine"
    assert priced_for(capsys, "megatron") == "megatron"
    mine.write_text("base: megatron\nname: meg-bf16-grads\ngrad_bytes_bf16: 2.0\n")
    assert priced_for(capsys, str(mine)) == "meg-bf16-grads"


def test_a_customised_preset_keeps_its_presets_error_band(tmp_path) -> None:
    """The band comes from the base preset's validated runs, whatever the file calls itself."""
    plan = plan_from_dict(LLAMA8B)
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: megatron\nname: meg-bf16-grads\ngrad_bytes_bf16: 2.0\n")
    custom, preset = estimate_plan(plan, runtime=str(mine)), estimate_plan(plan,
                                                                          runtime="megatron")
    assert custom.runtime == "meg-bf16-grads" and load_runtime(str(mine)).base == "megatron"
    assert (custom.error_band, custom.error_bias) == (preset.error_band, preset.error_bias)
    own = tmp_path / "own.yaml"
    own.write_text("name: meg-bf16-grads\n")  # no base: no validated runs of its own
    assert estimate_plan(plan, runtime=str(own)).error_band != preset.error_band


@pytest.mark.parametrize("name", ['""', '"   "'])
def test_a_blank_name_is_refused(capsys, tmp_path, name) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"base: megatron\nname: {name}\n")
    assert "--runtime.name: got '" in refused(capsys, str(path))


def test_a_file_may_not_call_itself_a_preset_it_differs_from(capsys, tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("base: megatron\nname: megatron\n")  # the preset itself: allowed
    assert priced_for(capsys, str(path)) == "megatron"
    path.write_text("base: megatron\nname: megatron\nfused_norm: false\n")
    assert "--runtime.name: got 'megatron', a preset" in refused(capsys, str(path))


def test_a_value_that_looks_like_a_path_is_read_as_a_file(capsys, tmp_path) -> None:
    assert "--runtime: no such file" in refused(capsys, str(tmp_path / "nope.yaml"))
    (tmp_path / "x.yaml").mkdir()
    assert "--runtime: " in (err := refused(capsys, str(tmp_path / "x.yaml")))
    assert "is a directory" in err
    upper = tmp_path / "T_BASE.YAML"
    upper.write_text("base: megatron\ngrad_bytes_bf16: 2.0\n")
    assert priced_for(capsys, str(upper)) == "megatron+T_BASE"
    bare = tmp_path / "traits"
    bare.write_text("base: megatron\ngrad_bytes_bf16: 2.0\n")
    assert priced_for(capsys, str(bare)) == "megatron+traits"
    assert "--runtime: unknown runtime 'megatorn'; did you mean 'megatron'?" in refused(
        capsys, "megatorn")
    assert "did you mean 'megatron-deepep'?" in refused(capsys, "megatron-deep")
    assert "did you mean" not in refused(capsys, "zzz")  # nothing near: the list only


def test_a_bad_field_is_named_under_the_flag_once(capsys, tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("base: megatron\ntp_comm_overlap: 2.0\n")
    err = refused(capsys, str(path))
    assert "--runtime.tp_comm_overlap: got 2.0; expected a fraction" in err
    assert "runtime.runtime" not in err
