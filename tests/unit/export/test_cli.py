"""`autoplan export` / `autoplan import` through the real command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import load_plan, plan_to_dict, save_plan

from .cases import CASES


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")


def test_export_prints_to_stdout(plan_file: Path, capsys):
    assert main(["export", str(plan_file), "--to", "deepspeed"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["zero_optimization"]["stage"] == 1
    assert "deepspeed --num_nodes=2" in err  # the launch command is a hint on stderr


def test_export_json_wraps_every_file(plan_file: Path, capsys):
    assert main(["export", str(plan_file), "--to", "deepspeed", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "deepspeed" and set(data["files"]) == {"ds_config.json", "launch.sh"}


def test_out_never_overwrites_silently(plan_file: Path, tmp_path: Path, capsys):
    out = tmp_path / "job.sbatch"
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(out)]) == 0
    first = out.read_text()
    out.write_text("mine\n")
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(out)]) == 2
    assert out.read_text() == "mine\n"
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(out), "--force"]) == 0
    assert out.read_text() == first


def test_extra_files_go_beside_out(plan_file: Path, tmp_path: Path):
    out = tmp_path / "ds.json"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["train_batch_size"] == 128
    assert (tmp_path / "ds.launch.sh").read_text().startswith("#!/usr/bin/env bash")


def test_refused_plan_exits_2_and_writes_nothing(tmp_path: Path, capsys):
    plan_file = save_plan(CASES["sp-without-tp"][0], tmp_path / "plan.yaml")
    out = tmp_path / "megatron.sh"
    assert main(["export", str(plan_file), "--to", "megatron", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sequence_parallel=true needs parallel.tp > 1" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_gpus_per_node_flag_overrides_the_profile(plan_file: Path, capsys):
    assert main(["export", str(plan_file), "--to", "slurm", "--gpus-per-node", "4"]) == 0
    assert "#SBATCH --nodes=4" in capsys.readouterr().out


def test_import_writes_a_plan_that_loads(plan_file: Path, tmp_path: Path, capsys):
    ds = tmp_path / "ds.json"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(ds)]) == 0
    out = tmp_path / "imported.yaml"
    argv = [
        "import",
        str(ds),
        "--from",
        "deepspeed",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "h100-sxm-80gb",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert load_plan(out) == CASES["dp-zero1"][0]
    assert main(argv) == 2  # exists: not replaced without --force
    # --format json with --out writes JSON (not YAML under a .json name), a plan that loads
    as_json = tmp_path / "imported.json"
    assert main([*argv[:-1], str(as_json), "--format", "json"]) == 0
    assert json.loads(as_json.read_text())["parallel"] == json.loads(json.dumps(
        plan_to_dict(CASES["dp-zero1"][0])))["parallel"]
    assert load_plan(as_json) == CASES["dp-zero1"][0]


def test_import_needs_a_model_for_deepspeed(tmp_path: Path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}')
    argv = ["import", str(ds), "--from", "deepspeed", "--cluster", "h100-sxm-80gb"]
    assert main(argv) == 2
    assert "--model" in capsys.readouterr().err


def test_imported_megatron_launch_can_be_estimated(tmp_path: Path, capsys):
    script = Path(__file__).resolve().parents[2] / "data" / "export" / "megatron_gpt3_175b.sh"
    out = tmp_path / "imported.yaml"
    argv = [
        "import",
        str(script),
        "--from",
        "megatron",
        "--cluster",
        "a100-sxm4-80gb",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    # the plan records no engine: the import says how to price it as Megatron-LM runs it
    assert (f"price it as megatron runs it: autoplan estimate --plan {out} --runtime megatron"
            in capsys.readouterr().err)
    assert main(["estimate", "--plan", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"].startswith("autoplan")
    assert main(["estimate", "--plan", str(out), "--runtime", "megatron", "--format",
                 "json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "megatron"


def test_import_set_edits_what_the_config_cannot_say(tmp_path: Path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text(
        '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, '
        '"gradient_accumulation_steps": 8, "bf16": {"enabled": true}}'
    )
    argv = [
        "import",
        str(ds),
        "--from",
        "deepspeed",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "h100-sxm-80gb",
        "--set",
        "attention=eager",
        "--format",
        "json",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["attention"] == "eager" and data["parallel"]["dp"] == 8


def test_import_rejects_a_model_that_disagrees_with_the_flags(tmp_path: Path, capsys):
    script = tmp_path / "args.txt"
    script.write_text("--num-layers 12 --micro-batch-size 1\n")
    argv = [
        "import",
        str(script),
        "--from",
        "megatron",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "h100-sxm-80gb",
        "--num-gpus",
        "8",
    ]
    assert main(argv) == 2
    assert "--num-layers" in capsys.readouterr().err


# ---- issue #14 item 3: names that would inject lines or break the scheduler's rules ------------


@pytest.mark.parametrize(
    "name", ["a\nrm -rf $HOME", "a;rm -rf ~", "../x", "job name", "$(id)", "-x", "j%j", ""]
)
def test_slurm_job_name_outside_the_safe_set_is_refused(plan_file: Path, tmp_path: Path,
                                                        capsys, name: str):
    out = tmp_path / "job.sbatch"
    code = main(["export", str(plan_file), "--to", "slurm", f"--job-name={name}", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--job-name" in err
    assert list(tmp_path.iterdir()) == [plan_file]  # nothing written


def test_slurm_job_name_in_the_safe_set_is_written_as_is(plan_file: Path, capsys):
    assert main(["export", str(plan_file), "--to", "slurm", "--job-name", "llm_7b.v2-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --job-name=llm_7b.v2-run\n#SBATCH --nodes=" in out


def test_slurm_checkpoint_dir_with_a_line_break_is_refused(plan_file: Path, capsys):
    code = main(["export", str(plan_file), "--to", "slurm", "--checkpoint-dir", "ck\nrm -rf /"])
    assert code == 2 and "--checkpoint-dir" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--job-name", "--namespace"])
@pytest.mark.parametrize("name", ["My_Job Name!", "../x", "Upper", "a" * 64, "-a", "a-", "a.b"])
def test_kubernetes_names_must_be_dns_labels(plan_file: Path, capsys, flag: str, name: str):
    """Namespaces are RFC 1123 labels; the job's name is an RFC 1035 label's prefix (its pods'
    and Services' names, test_kube_names.py)."""
    code = main(["export", str(plan_file), "--to", "kubernetes", f"{flag}={name}"])
    _, err = capsys.readouterr()
    rfc = "RFC 1123" if flag == "--namespace" else "RFC 1035"
    assert code == 2 and err.count("\n") == 1 and flag in err and rfc in err


def test_kubernetes_valid_names_pass(plan_file: Path, capsys):
    assert main(["export", str(plan_file), "--to", "kubernetes", "--job-name", "llm-7b-0",
                 "--namespace", "ml-team"]) == 0
    assert "namespace: ml-team" in capsys.readouterr().out


@pytest.fixture
def multi_node_plan(tmp_path: Path) -> Path:
    return save_plan(CASES["megatron-3d"][0], tmp_path / "big.yaml")


@pytest.mark.parametrize("target", ["torchrun", "megatron"])
def test_job_names_that_reach_a_launch_script_are_checked(multi_node_plan: Path, capsys,
                                                          target: str):
    name = "x;touch /tmp/autoplan-pwned${IFS}$(id)"
    code = main(["export", str(multi_node_plan), "--to", target, f"--job-name={name}"])
    _, err = capsys.readouterr()
    assert code == 2 and "--job-name" in err and err.count("\n") == 1


def test_megatron_script_is_quoted(multi_node_plan: Path, capsys):
    assert main(["export", str(multi_node_plan), "--to", "megatron",
                 "--script", "a.py;touch /tmp/x"]) == 0
    assert "'a.py;touch /tmp/x'" in capsys.readouterr().out


def test_kubernetes_checkpoint_dir_is_not_expanded_by_the_container_shell(plan_file: Path,
                                                                          capsys):
    assert main(["export", str(plan_file), "--to", "kubernetes",
                 "--checkpoint-dir", "$(touch /tmp/x)"]) == 0
    out = capsys.readouterr().out
    assert "'$(touch /tmp/x)'" in out and '"$(touch /tmp/x)"' not in out


# ---- plan rules and --format with --out -------------------------------------------------------


@pytest.mark.parametrize("target", ["torchtitan", "torchrun"])
def test_a_plan_the_rules_refuse_exits_2_and_writes_nothing(tmp_path: Path, capsys, target: str):
    """plan_rules.validate_plan judges every export: pp=4 1F1B with 2 micro-batches per step
    (torch's Schedule1F1B raises "Number of microbatches (2) must be greater than or equal to
    the number of stages (4)")."""
    from autoplan.plan import Batch, Parallel, Pipeline, Schedule

    from .cases import plan

    bad = plan("llama-3-8b", 8, parallel=Parallel(dp=2, pp=4), zero_stage=2,
               pipeline=Pipeline(Schedule.ONE_F_ONE_B), batch=Batch(4, 16))
    plan_file = save_plan(bad, tmp_path / "plan.yaml")
    out = tmp_path / ("job.py" if target == "torchtitan" else "job.sh")
    assert main(["export", str(plan_file), "--to", target, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs micro-batches per step (2) >= pp=4" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_format_wrapper_at_out_names_the_files_inside_it(plan_file: Path, tmp_path: Path,
                                                         fmt: str):
    """--format json/yaml writes {target, files} to --out; the launch command names the config
    by its key in the wrapper, and torchtitan takes a wrapper path that is not NAME.py."""
    import yaml

    out = tmp_path / f"wrapped.{fmt}"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(out),
                 "--format", fmt]) == 0
    files = yaml.safe_load(out.read_text())["files"]  # YAML reads JSON too
    assert '--deepspeed_config="$script_dir"/ds_config.json' in files["launch.sh"]
    titan = tmp_path / f"titan.{fmt}"
    tt_plan = save_plan(CASES["llama2-13b-fsdp"][0], tmp_path / "tt.yaml")
    assert main(["export", str(tt_plan), "--to", "torchtitan", "--out", str(titan),
                 "--format", fmt]) == 0
    [name] = yaml.safe_load(titan.read_text())["files"]
    assert name == "autoplan_torchtitan.py"


@pytest.mark.parametrize("flag, value", [("--image", "img:1"), ("--kind", "jobset"),
                                         ("--namespace", "ml"), ("--torchtitan-format", "toml"),
                                         ("--script", "x.py")])
def test_an_option_the_target_does_not_write_is_refused(plan_file: Path, capsys, flag: str,
                                                        value: str):
    """--to slurm writes no image, resource kind, namespace, torchtitan config or script:
    one line naming the option and the targets that take it, not a silent drop."""
    code = main(["export", str(plan_file), "--to", "slurm", flag, value])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and flag in err and "slurm" in err


@pytest.mark.parametrize("argv", [["--max-restarts", "-1"], ["--min-nodes", "0"],
                                  ["--gpus-per-node", "0"]])
def test_export_counts_are_checked(plan_file: Path, capsys, argv: list[str]):
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal
        main(["export", str(plan_file), "--to", "slurm", *argv])
    _, err = capsys.readouterr()
    assert exit_.value.code == 2 and argv[0] in err and err.count("\n") == 1


def test_import_names_a_bad_gpu_count(tmp_path: Path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1}))
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(cfg), "--from", "deepspeed", "--model", "gpt3-125m",
              "--cluster", "a100-sxm4-80gb", "--num-gpus", "-8"])
    _, err = capsys.readouterr()
    assert exit_.value.code == 2 and "--num-gpus" in err


def test_a_failed_second_file_leaves_no_first_file(plan_file: Path, tmp_path: Path, capsys,
                                                   monkeypatch):
    """ds.json was written and kept when ds.launch.sh then failed (a full disk): every file is
    staged first, renamed into place only when all are, and `wrote` follows the renames."""
    import os

    from autoplan import fileset

    calls = {"n": 0}
    real = os.fsync

    def full_on_second(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(fileset.os, "fsync", full_on_second)
    out = tmp_path / "ds.json"
    code = main(["export", str(plan_file), "--to", "deepspeed", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "No space left" in err, err
    assert "wrote" not in err.replace("wrote none", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


@pytest.mark.parametrize("argv, needle", [
    (["--to", "kubernetes", "--image", "a b"], "--image: got 'a b'"),
    (["--to", "kubernetes", "--image", ""], "--image: got ''"),
    (["--to", "megatron", "--script", ""], "--script: got ''"),
    (["--to", "deepspeed", "--script", " "], "--script: got ' '"),
    (["--to", "deepspeed", "--script", "a\nb"], "--script: got 'a\\nb'"),
    (["--to", "megatron", "--script", "a\tb.py"], "--script: got 'a\\tb.py'"),
    (["--to", "torchrun", "--checkpoint-dir", "ck\nx"], "--checkpoint-dir: got 'ck\\nx'"),
])
def test_words_written_into_a_launch_are_checked(multi_node_plan: Path, tmp_path: Path, capsys,
                                                 argv: list[str], needle: str):
    """Each was written with exit 0: an empty image or script silently defaulted, a line break
    split the launch script's line."""
    from tests.cli_refusals import assert_refused

    out = tmp_path / "job.out"
    assert_refused(capsys, ["export", str(multi_node_plan), *argv, "--out", str(out)], needle)
    assert not out.exists()
