"""`import --from megatron` of a file that is no Megatron-LM launch (user test 37, finding 11):
one line saying none of the arguments the import reads were found and what file to give, not
a refusal of something the file never said (its "missing" RoPE scaling beside --model)."""

from __future__ import annotations

from pathlib import Path

from autoplan.commands import main
from autoplan.plan_files import save_plan
from tests.cli_refusals import assert_refused

from .cases import CASES

CLUSTER = "h100-sxm-80gb"


def _import(path: Path, *extra: str) -> list[str]:
    return ["import", str(path), "--from", "megatron", "--cluster", CLUSTER, "--model",
            "llama-3.1-8b", "--num-gpus", "16", *extra]


def test_an_exported_autoplan_job_is_named_as_no_megatron_launch(tmp_path: Path, capsys):
    plan_file = tmp_path / "plan.yaml"
    save_plan(CASES["dp-zero1"][0], plan_file)
    job = tmp_path / "job.sbatch"
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(job)]) == 0
    capsys.readouterr()
    out = tmp_path / "imp.yaml"
    err = assert_refused(capsys, _import(job, "--out", str(out)),
                         f"FILE {job}: no Megatron-LM arguments found",
                         "--num-layers", "--tensor-model-parallel-size",
                         "give the pretrain_gpt.py launch script",
                         f"this file runs `autoplan train {plan_file}`")
    assert "rope" not in err.lower()  # the downstream refusal it gave before
    assert not out.exists()


def test_torchrun_flags_alone_are_no_megatron_arguments(tmp_path: Path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nnodes 2 --nproc-per-node 8 train.py --lr 3e-4 --epochs 3\n")
    err = assert_refused(capsys, _import(script), "no Megatron-LM arguments found",
                         "its flags (--lr --epochs) are none of them")
    assert "autoplan train" not in err


def test_a_megatron_launch_still_imports(tmp_path: Path, capsys):
    script = tmp_path / "megatron.sh"
    script.write_text(
        "torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 "
        "--hidden-size 4096 --num-attention-heads 32 --seq-length 8192 --micro-batch-size 1 "
        "--global-batch-size 64 --vocab-size 50304 --max-position-embeddings 8192 --bf16\n")
    out = tmp_path / "imp.yaml"
    assert main(["import", str(script), "--from", "megatron", "--cluster", CLUSTER,
                 "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.exists()


def test_a_kubernetes_manifest_names_the_env_var_its_plan_travels_in(tmp_path: Path, capsys):
    """The manifest's `autoplan train` reads a path inside the pod: the plan is in the
    manifest's AUTOPLAN_PLAN_YAML, which the refusal names, not the pod's path."""
    plan_file = tmp_path / "plan.yaml"
    save_plan(CASES["dp-zero1"][0], plan_file)
    manifest = tmp_path / "job.yaml"
    assert main(["export", str(plan_file), "--to", "kubernetes", "--out", str(manifest)]) == 0
    capsys.readouterr()
    err = assert_refused(capsys, _import(manifest), "no Megatron-LM arguments found",
                         "this Kubernetes manifest runs `autoplan train` on the plan it carries "
                         "in AUTOPLAN_PLAN_YAML")
    assert "/tmp/autoplan-plan.yaml" not in err
