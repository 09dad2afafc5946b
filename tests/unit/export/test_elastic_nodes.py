"""An elastic export written for `--gpus-per-node N` re-plans on nodes of N GPUs: the job
hands N to `autoplan train --elastic` (nodes.NODE_SIZE_ENV), whose re-plan is then the plan
`autoplan search` picks on a profile of N GPUs per node, as the export priced and checked it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan import resources
from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.nodes import NODE_SIZE_ENV
from autoplan.export.registry import get_target
from autoplan.plan_files import save_plan
from autoplan.runtime.elastic import agree_on_plan, describe, job_gpus_per_node, replan
from autoplan.yaml_io import read_yaml

from .cases import plan


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in the test's folder: export resolves the checkpoint folder against the working
    directory and the scripts run here make it (`mkdir -p`), which left an empty
    `checkpoints/` and `ck/` in the checkout."""
    monkeypatch.chdir(tmp_path)

PLAN = plan("llama-3-8b", 16, zero_stage=3)
"""16 GPUs, 2 nodes of the profile's 8 (h100-sxm-80gb), 4 of 4 GPUs."""
PRESENT = 12
"""A node of 4 lost: the survivors re-plan for 12 ranks."""


def _job_env(script: Path, tmp_path: Path) -> dict[str, str]:
    """The environment the sbatch script's srun (hence torchrun and train) starts with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "srun-env.json"
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\npython3 -c 'import json, os, sys; "
        "json.dump(dict(os.environ), open(sys.argv[1], \"w\"))' " + f"'{seen}'\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != NODE_SIZE_ENV}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "SLURM_JOB_NODELIST": "node[1-4]",
            "SLURM_JOB_ID": "7"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30, cwd=tmp_path,
                   capture_output=True)
    return json.loads(seen.read_text())


@pytest.mark.parametrize(("flags", "expected"), [
    (["--elastic", "--gpus-per-node", "4"], "4"),
    (["--elastic"], "8"),  # the profile's, said all the same
    ([], None),  # a job that does not re-plan is not told
])
def test_the_slurm_job_hands_its_node_size_to_train(tmp_path, flags, expected):
    plan_file = tmp_path / "plan.yaml"
    save_plan(PLAN, plan_file)
    script = tmp_path / "job.sbatch"
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(script),
                 "--no-memory-check", *flags]) == 0
    assert _job_env(script, tmp_path).get(NODE_SIZE_ENV) == expected


@pytest.mark.parametrize("kind", ["pytorchjob", "jobset"])
def test_the_kubernetes_pods_get_the_node_size(kind):
    opts = ExportOptions(gpus_per_node=4, elastic=True, k8s_kind=kind)
    [text] = export_plan(get_target("kubernetes"), PLAN, PLAN.model_spec(), opts).values()
    manifest = yaml.safe_load(text)
    specs = (manifest["spec"]["pytorchReplicaSpecs"].values() if kind == "pytorchjob" else
             [job["template"]["spec"] for job in manifest["spec"]["replicatedJobs"]])
    for spec in specs:
        [container] = spec["template"]["spec"]["containers"]
        assert {"name": NODE_SIZE_ENV, "value": "4"} in container["env"]


def _profile_of_one_gpu_nodes(tmp_path: Path) -> Path:
    data = read_yaml(resources.find(resources.PROFILES, "h100-sxm-80gb"), "profile")
    data["gpus_per_node"] = 1
    path = tmp_path / "h100-1.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _layout(p) -> tuple:
    return (p.parallel.dp, p.parallel.tp, p.parallel.pp, p.parallel.cp, p.zero_stage,
            p.batch.micro_batch_size)


def test_the_replan_on_n_gpu_nodes_is_what_search_picks_on_such_a_profile(tmp_path, capsys):
    on_one = replan(PLAN, PRESENT, gpus_per_node=1)
    profile = _profile_of_one_gpu_nodes(tmp_path)
    assert main(["search", "--model", "llama-3-8b", "--cluster", str(profile), "--num-gpus",
                 str(on_one.world_size), "--global-batch-size",
                 str(PLAN.batch.global_batch_size), "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert _layout(on_one.plan) == (best["parallel"]["dp"], best["parallel"]["tp"],
                                    best["parallel"]["pp"], best["parallel"]["cp"],
                                    best["zero_stage"], best["batch"]["micro_batch_size"])
    assert on_one.plan.cluster.profile == PLAN.cluster.profile  # the plan keeps its profile
    # on the profile's 8-GPU nodes the same world is split otherwise (cp 2 inside a node)
    assert _layout(replan(PLAN, PRESENT).plan) != _layout(on_one.plan)


class _Store:
    """The job store's calls agree_on_plan makes (torch.distributed.Store)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def wait(self, keys, timeout) -> None:
        assert all(k in self.data for k in keys)


def test_every_rank_replans_on_the_node_size_the_job_was_written_for(tmp_path, monkeypatch):
    plan_file = tmp_path / "plan.yaml"
    save_plan(PLAN, plan_file)
    args = argparse.Namespace(plan=str(plan_file), min_gpus=4, space=None, checkpoint_dir=None)
    monkeypatch.setenv(NODE_SIZE_ENV, "1")
    store = _Store()
    first = agree_on_plan(store, 0, PRESENT, args)
    other = agree_on_plan(store, 5, PRESENT, args)
    expected = replan(PLAN, PRESENT, gpus_per_node=1)
    assert first.plan == expected.plan and other.plan == expected.plan
    assert first.gpus_per_node == other.gpus_per_node == 1
    assert "1-GPU nodes" in describe(first, "plan.yaml")


@pytest.mark.parametrize("raw", ["0", "four", "", "1025", "9" * 5000])
def test_a_node_size_no_export_writes_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(NODE_SIZE_ENV, raw)
    with pytest.raises(ConfigError, match=f"^{NODE_SIZE_ENV}: got") as err:
        job_gpus_per_node()
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    monkeypatch.delenv(NODE_SIZE_ENV)
    assert job_gpus_per_node() is None
