"""The torchrun, SLURM and Kubernetes exports as a scheduled job runs them: the training length
and checkpoint cadence reach `autoplan train`, a CPU profile's plan asks for CPUs and trains on
gloo, and --min-nodes without --elastic is a mistake in the command, not in the plan.

Each rendered file is read as its consumer reads it: `autoplan train`'s own parser on the
launched words, torchrun's parser on the launch, the #SBATCH lines, the manifest's resources.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_files import save_plan

from .cases import CASES
from .consumers import bash_syntax_ok, run_script, torchrun_args


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in the test's folder: export resolves the checkpoint folder against the working
    directory and the scripts run here make it (`mkdir -p`), which left an empty
    `checkpoints/` and `ck/` in the checkout."""
    monkeypatch.chdir(tmp_path)

K8S_KINDS = ("trainjob", "pytorchjob", "jobset")
CPU_PLAN = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", 4), parallel=Parallel(dp=4),
                batch=Batch(micro_batch_size=2, global_batch_size=8))
"""What `autoplan search --model tiny --cluster cpu-gloo --num-gpus 4 --global-batch-size 8
--space small-cpu` picks: four CPU ranks on one node of the cpu-gloo profile."""


def _train_flags(argv: list[str]) -> argparse.Namespace:
    """`autoplan train`'s own parser on the launched words from `autoplan train` on."""
    from autoplan.runtime.cli import add_train_arguments

    start = argv.index("autoplan")
    assert argv[start + 1] == "train", argv
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(argv[start + 2:])


def _export(tmp_path: Path, plan: Plan, target: str, *flags: str) -> str:
    """`autoplan export` through the CLI; the primary file's text."""
    plan_file = save_plan(plan, tmp_path / "plan.yaml")
    out = tmp_path / f"job-{target}.out"
    assert main(["export", str(plan_file), "--to", target, "--out", str(out), *flags]) == 0
    return out.read_text()


def _script_argv(tmp_path: Path, text: str, stubs: dict[str, str]) -> list[list[str]]:
    path = tmp_path / "launch.sh"
    path.write_text(text)
    bash_syntax_ok(path)
    return run_script(path, stubs)


def _torchrun_call(tmp_path: Path, target: str, text: str) -> list[str]:
    """The words torchrun receives (srun's own options dropped for SLURM)."""
    if target == "torchrun":
        [call] = _script_argv(tmp_path, text, {"torchrun": ""})
        return call[1:]
    [srun] = [c for c in _script_argv(tmp_path, text, {"scontrol": "node1", "srun": ""})
              if c[0] == "srun"]
    return srun[srun.index("torchrun") + 1:]


def _k8s_containers(doc: dict) -> list[dict]:
    spec = doc["spec"]
    if doc["kind"] == "TrainJob":
        return [spec["trainer"]]
    if doc["kind"] == "PyTorchJob":
        return [r["template"]["spec"]["containers"][0]
                for r in spec["pytorchReplicaSpecs"].values()]
    return [spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]]


def _k8s_train_argv(container: dict) -> list[str]:
    """The `exec torchrun ... autoplan train ...` half of the container's sh -c command."""
    return shlex.split(container["command"][2].split("&&", 1)[1])


def _launched_train(tmp_path: Path, plan: Plan, target: str, *flags: str) -> argparse.Namespace:
    if target.startswith("kubernetes"):
        kind = target.split(":")[1]
        doc = yaml.safe_load(_export(tmp_path, plan, "kubernetes", "--kind", kind, *flags))
        argvs = [_k8s_train_argv(c) for c in _k8s_containers(doc)]
        assert all(a == argvs[0] for a in argvs)
        return _train_flags(argvs[0])
    call = _torchrun_call(tmp_path, target, _export(tmp_path, plan, target, *flags))
    args = torchrun_args(call)
    return _train_flags([args.training_script, *args.training_script_args])


TARGETS = ("torchrun", "slurm", *(f"kubernetes:{k}" for k in K8S_KINDS))


# 1. training length and checkpoint cadence ------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_steps_and_checkpoint_cadence_reach_autoplan_train(tmp_path: Path, target: str):
    """The job trained train's default 20 steps and never checkpointed on a schedule."""
    train = _launched_train(tmp_path, CASES["dp-zero1"][0], target, "--steps", "5000",
                            "--checkpoint-every", "250", "--keep-checkpoints", "2",
                            "--checkpoint-dir", "ck")
    assert (train.steps, train.checkpoint_every, train.keep_checkpoints) == (5000, 250, 2)
    # a job reading files where they lie gets the folder absolute, as export resolved it; a
    # pod's is a path in the pod
    ck = "ck" if target.startswith("kubernetes") else os.path.abspath("ck")
    assert train.resume and train.checkpoint_dir == ck and not train.elastic


@pytest.mark.parametrize("target", TARGETS)
def test_a_job_that_restarts_checkpoints_periodically_by_default(tmp_path: Path, target: str):
    """torchrun --max-restarts=3 restarted the ranks from step 0: with no option given the job
    now saves every 100 steps (launch.CHECKPOINT_EVERY) and runs train's default 20 steps."""
    train = _launched_train(tmp_path, CASES["dp-zero1"][0], target)
    assert (train.steps, train.checkpoint_every) == (20, 100)
    assert train.keep_checkpoints == 3 and train.resume  # train's own default, not written


def test_default_steps_are_trains_default():
    """The one fact written on both sides: export's default length is train's --steps."""
    from autoplan.export.launch import CHECKPOINT_EVERY, TRAIN_STEPS

    assert CHECKPOINT_EVERY == 100
    from autoplan.runtime.cli import add_train_arguments

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert parser.parse_args(["plan.yaml"]).steps == TRAIN_STEPS


def test_exact_train_command_words(tmp_path: Path):
    text = _export(tmp_path, CASES["dp-zero1"][0], "torchrun", "--steps", "7",
                   "--checkpoint-every", "3")
    train = next(line.strip() for line in text.splitlines()
                 if line.strip().startswith("autoplan train "))
    assert train == (  # its status read after it (saved_step.end_lines)
        f"autoplan train {tmp_path / 'plan.yaml'} --steps 7 --checkpoint-dir "
        f"{os.path.abspath('checkpoints')} "
        "--checkpoint-every 3 --resume || status=$?")


def test_elastic_job_takes_the_given_cadence(tmp_path: Path):
    train = _launched_train(tmp_path, CASES["megatron-3d"][0], "slurm", "--elastic",
                            "--min-nodes", "2", "--checkpoint-every", "10", "--steps", "900")
    assert train.elastic and train.min_gpus == 16
    assert (train.steps, train.checkpoint_every) == (900, 10)


def test_export_help_offers_the_train_options(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--steps", "--checkpoint-every", "--keep-checkpoints"):
        assert flag in out
    assert "default 100" in out and "default 20" in out


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--steps", "0", "from 1"), ("--steps", "-5", "from 1"), ("--steps", "ten", "a whole number"),
    ("--checkpoint-every", "-1", "from 0"), ("--keep-checkpoints", "-2", "from 0"),
    ("--checkpoint-every", "1.5", "a whole number"),
])
def test_bad_train_values_are_one_line_exit_2(tmp_path: Path, capsys, flag: str, value: str,
                                              expected: str):
    plan_file = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(plan_file), "--to", "slurm", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert flag in err and value in err and expected in err, err


@pytest.mark.parametrize(("field", "value"), [("steps", 0), ("checkpoint_every", -1),
                                              ("keep_checkpoints", -1)])
def test_bad_train_values_are_refused_by_the_targets_too(field: str, value: int):
    from autoplan.export.launch import LaunchOptions

    plan = CASES["dp-zero1"][0]
    for target in ("torchrun", "slurm", "kubernetes"):
        with pytest.raises(ConfigError) as err:
            export_plan(get_target(target), plan, plan.model_spec(),
                        LaunchOptions(gpus_per_node=8, **{field: value}))
        assert err.value.field == "--" + field.replace("_", "-") and str(value) in str(err.value)


@pytest.mark.parametrize("flag", ["--steps", "--checkpoint-every", "--keep-checkpoints"])
def test_train_options_are_refused_by_targets_that_do_not_run_train(tmp_path: Path, capsys,
                                                                    flag: str):
    plan_file = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    assert main(["export", str(plan_file), "--to", "deepspeed", flag, "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err and "torchrun" in err and "slurm" in err


# 2. a CPU profile's plan --------------------------------------------------------------------


def test_cpu_plan_is_a_cpu_slurm_job_on_gloo(tmp_path: Path):
    text = _export(tmp_path, CPU_PLAN, "slurm")
    sbatch = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    assert "--cpus-per-task=4" in sbatch and "--ntasks-per-node=1" in sbatch
    assert not any("gpu" in line for line in sbatch), sbatch
    [srun] = [c for c in _script_argv(tmp_path, text, {"scontrol": "node1", "srun": ""})
              if c[0] == "srun"]
    # srun inherits no --cpus-per-task from sbatch (Slurm >= 22.05): the one task gets 4 CPUs
    assert srun[1:3] == ["--cpus-per-task=4", "torchrun"]
    args = torchrun_args(srun[3:])
    assert (args.nnodes, args.nproc_per_node) == ("1", "4")
    assert _train_flags([args.training_script, *args.training_script_args]).backend == "gloo"


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch (slurm-client) not installed")
def test_real_sbatch_parses_the_cpu_job(tmp_path: Path):
    path = tmp_path / "cpu.sbatch"
    path.write_text(_export(tmp_path, CPU_PLAN, "slurm"))
    conf = tmp_path / "slurm.conf"  # a CPU-only cluster: no GresTypes
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\nMessageTimeout=1\n"
                    "NodeName=n[1-4] CPUs=16\nPartitionName=cpu Nodes=ALL Default=YES\n")
    done = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True,
                          env={**os.environ, "SLURM_CONF": str(conf)}, timeout=60)
    assert "unrecognized option" not in done.stderr and "invalid" not in done.stderr.lower()
    assert "Unable to contact slurm controller" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", K8S_KINDS)
def test_cpu_plan_requests_cpus_not_gpus_on_kubernetes(tmp_path: Path, kind: str):
    from .test_kubernetes import validate

    text = _export(tmp_path, CPU_PLAN, "kubernetes", "--kind", kind)
    assert "nvidia.com/gpu" not in text
    doc = yaml.safe_load(text)
    validate(kind, doc)  # the published API models still read it
    for container in _k8s_containers(doc):
        resources = container.get("resources", container.get("resourcesPerNode"))
        # a CPU per rank; 3/4 of cpu-gloo's 24 GiB host for 4 of its 8 rank slots
        assert resources == {"requests": {"cpu": "4", "memory": "9Gi"}}
        assert _train_flags(_k8s_train_argv(container)).backend == "gloo"


def test_cpu_plan_torchrun_trains_on_gloo(tmp_path: Path):
    text = _export(tmp_path, CPU_PLAN, "torchrun")
    assert "--backend gloo" in text and "4 CPU processes" in text


@pytest.mark.parametrize("target", TARGETS)
def test_gpu_plan_keeps_its_gpus_and_trains_auto(tmp_path: Path, target: str):
    """A GPU profile's plan is unchanged: GPUs requested, train's --backend auto (NCCL)."""
    text = _export(tmp_path, CASES["dp-zero1"][0], target.split(":")[0],
                   *(("--kind", target.split(":")[1]) if ":" in target else ()))
    assert "--backend" not in text and "cpus-per-task" not in text
    if target == "slurm":
        assert re.search(r"^#SBATCH --gpus-per-node=8$", text, re.M)
    if target.startswith("kubernetes"):
        assert "nvidia.com/gpu: '8'" in text and "cpu:" not in text


# 3. --min-nodes without --elastic -----------------------------------------------------------


@pytest.mark.parametrize("target", ["slurm", "kubernetes", "torchrun", "deepspeed"])
def test_min_nodes_without_elastic_names_the_flag_and_the_fix(tmp_path: Path, capsys,
                                                              target: str):
    """A target that writes elastic jobs asks for --elastic; one that does not (where --elastic
    would be refused next) says so (issue: "add --elastic", then refused)."""
    plan_file = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    out = tmp_path / "job"
    assert main(["export", str(plan_file), "--to", target, "--min-nodes", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    if target in ("slurm", "kubernetes"):
        assert err == ("autoplan export: error: --min-nodes: got 2 without --elastic; "
                       "add --elastic, or drop --min-nodes\n")
    else:
        assert err == (f"autoplan export: error: --min-nodes: --to {target} writes no "
                       "min-nodes; drop it, or export --to slurm or kubernetes\n")
    assert not out.exists()


@pytest.mark.parametrize("target", ["slurm", "kubernetes", "torchrun"])
def test_min_nodes_without_elastic_is_not_a_plan_refusal_in_the_api(target: str):
    plan = CASES["megatron-3d"][0]
    with pytest.raises(ConfigError) as err:
        export_plan(get_target(target), plan, plan.model_spec(),
                    ExportOptions(gpus_per_node=8, min_nodes=2))
    assert err.value.field == "--min-nodes" and "cannot express" not in str(err.value)
    assert err.value.fix is not None and "add --elastic" in err.value.fix


def test_min_nodes_above_the_plans_nodes_names_the_range():
    plan = CASES["megatron-3d"][0]  # 64 GPUs: 8 nodes of 8
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("slurm"), plan, plan.model_spec(),
                    ExportOptions(gpus_per_node=8, elastic=True, min_nodes=9))
    assert err.value.field == "--min-nodes" and "got 9" in str(err.value)
    assert err.value.fix == "give 1 to 8"
