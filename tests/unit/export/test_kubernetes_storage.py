"""Kubernetes pods a platform engineer would run: /dev/shm, the checkpoint and data claims
(--pvc, --data-pvc), memory requests from the profile's host memory. Checked against the
published API models (test_kubernetes.validate) and through the real CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.commands import main
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.kube_pods import MEMORY_SHARE
from autoplan.export.kubernetes import PATCH_MANAGER, TRAINER_NODE
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.hardware import load_profile
from autoplan.plan import ClusterRef, save_plan

from .cases import CASES
from .test_kubernetes import validate

KINDS = ("trainjob", "pytorchjob", "jobset")
SHM = {"name": "dshm", "emptyDir": {"medium": "Memory"}}


def _manifest(kind: str, case: str = "dp-zero1", **kw: Any) -> tuple[str, dict]:
    plan = CASES[case][0]
    opts = LaunchOptions(gpus_per_node=8, k8s_kind=kind, **kw)
    [text] = export_plan(get_target("kubernetes"), plan, plan.model_spec(), opts).values()
    doc = yaml.safe_load(text)
    validate(kind, doc)  # the published API models read every field written
    return text, doc


def _pods(kind: str, doc: dict) -> list[tuple[list[dict], dict, dict]]:
    """(volumes, trainer container's mounts, resources) of every pod template."""
    if kind == "trainjob":
        [patch] = doc["spec"]["runtimePatches"]
        assert patch["manager"] == PATCH_MANAGER
        [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert job["name"] == TRAINER_NODE  # the torch-distributed runtime's job and container
        pod = job["template"]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["name"] == TRAINER_NODE
        return [(pod["volumes"], container["volumeMounts"],
                 doc["spec"]["trainer"]["resourcesPerNode"])]
    if kind == "pytorchjob":
        specs = [r["template"]["spec"] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    else:
        specs = [doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]]
    return [(s["volumes"], s["containers"][0]["volumeMounts"], s["containers"][0]["resources"])
            for s in specs]


def _header(text: str) -> str:
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


@pytest.mark.parametrize("kind", KINDS)
def test_every_pod_gets_a_memory_backed_dev_shm(kind: str):
    text, doc = _manifest(kind)
    pods = _pods(kind, doc)
    assert len(pods) == (2 if kind == "pytorchjob" else 1)  # Master and Worker templates
    for volumes, mounts, _ in pods:
        assert volumes == [SHM]
        assert mounts == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "&id" not in text and "*id" not in text  # each template written out, no aliases


@pytest.mark.parametrize("kind", KINDS)
def test_claims_are_mounted_at_the_checkpoint_and_data_folders(kind: str):
    text, doc = _manifest(kind, checkpoint_dir="/ckpt/run1", pvc="train-ckpt",
                          data="/corpus/wiki.txt", data_pvc="corpus.v2")
    for volumes, mounts, _ in _pods(kind, doc):
        assert volumes == [SHM,
                           {"name": "checkpoints",
                            "persistentVolumeClaim": {"claimName": "train-ckpt"}},
                           {"name": "data", "persistentVolumeClaim": {"claimName": "corpus.v2"}}]
        assert mounts[1:] == [{"name": "checkpoints", "mountPath": "/ckpt/run1"},
                              {"name": "data", "mountPath": "/corpus", "readOnly": True}]
    header = _header(text)
    assert "PersistentVolumeClaim train-ckpt is mounted" in header
    assert "ReadWriteMany claim, which all 2 pods read and write" in header
    assert "corpus.v2 is mounted read-only at /corpus, so the claim must hold wiki.txt" in header


def test_one_claim_for_both_is_one_volume_mounted_twice():
    _, doc = _manifest("jobset", checkpoint_dir="/store/ckpt", pvc="store",
                       data="/store/text/wiki.txt", data_pvc="store")
    [(volumes, mounts, _)] = _pods("jobset", doc)
    assert volumes[1:] == [{"name": "checkpoints",
                            "persistentVolumeClaim": {"claimName": "store"}}]
    assert mounts[1:] == [{"name": "checkpoints", "mountPath": "/store/ckpt"},
                          {"name": "checkpoints", "mountPath": "/store/text", "readOnly": True}]


@pytest.mark.parametrize("checkpoint_dir, words", [
    ("/ckpt", "checkpoints: /ckpt in every pod, where every rank writes its shard"),
    ("checkpoints", "relative to the image's working folder, where no storage is mounted"),
])
def test_without_a_claim_the_header_names_the_path_to_mount(checkpoint_dir: str, words: str):
    text, doc = _manifest("pytorchjob", checkpoint_dir=checkpoint_dir, data="/corpus/wiki.txt")
    header = _header(text)
    assert words in header and "--pvc CLAIM" in header
    assert "mount a volume at /corpus (export --data-pvc CLAIM)" in header
    assert all(volumes == [SHM] for volumes, _, _ in _pods("pytorchjob", doc))


@pytest.mark.parametrize("kind", KINDS)
def test_memory_is_requested_from_the_profiles_host_memory(kind: str):
    text, doc = _manifest(kind)
    host = load_profile("h100-sxm-80gb").host.memory_bytes  # 2 TiB per DGX H100 node
    expected = int(host * MEMORY_SHARE) // 2**30
    for _, _, resources in _pods(kind, doc):
        assert resources == {"requests": {"memory": f"{expected}Gi"},
                             "limits": {"nvidia.com/gpu": "8"}}
    assert "no CPU request: the profile gives no core count" in _header(text)


def test_a_pod_of_part_of_a_node_requests_its_share():
    _, doc = _manifest("jobset", case="single-node-tp")
    [(_, _, resources)] = _pods("jobset", doc)
    gpus = int(resources["limits"]["nvidia.com/gpu"])
    host = load_profile("h100-sxm-80gb").host.memory_bytes
    assert gpus < 8 and resources["requests"]["memory"] == \
        f"{int(host * gpus / 8 * MEMORY_SHARE) // 2**30}Gi"


def test_a_profile_that_does_not_load_here_requests_no_memory_and_says_so():
    plan = CASES["dp-zero1"][0].replace(cluster=ClusterRef("other-sites-gpu", 16))
    opts = ExportOptions(gpus_per_node=8, k8s_kind="jobset")
    [text] = export_plan(get_target("kubernetes"), plan, plan.model_spec(), opts).values()
    [(_, _, resources)] = _pods("jobset", yaml.safe_load(text))
    assert resources == {"limits": {"nvidia.com/gpu": "8"}}
    assert "no memory request: profile other-sites-gpu does not load" in _header(text)


def _export(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    plan = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    out = tmp_path / "job.yaml"
    code = main(["export", str(plan), "--to", "kubernetes", "--out", str(out), *args])
    err = capsys.readouterr().err
    if code:
        assert not out.exists()  # refused before anything is written
    return code, err


def test_the_cli_writes_the_claims(tmp_path: Path, capsys):
    code, _ = _export(tmp_path, capsys, "--kind", "jobset", "--checkpoint-dir", "/ckpt",
                      "--pvc", "train-ckpt", "--data", "/corpus/wiki.txt", "--data-pvc",
                      "corpus")
    assert code == 0
    doc = yaml.safe_load((tmp_path / "job.yaml").read_text())
    [(volumes, _, _)] = _pods("jobset", doc)
    assert [v.get("persistentVolumeClaim", {}).get("claimName") for v in volumes] == \
        [None, "train-ckpt", "corpus"]


@pytest.mark.parametrize("args, words", [
    (["--pvc", "Train_Ckpt", "--checkpoint-dir", "/ckpt"], "--pvc: got 'Train_Ckpt'"),
    (["--pvc", "a" * 254, "--checkpoint-dir", "/ckpt"], "(254 characters)"),
    (["--pvc", "ckpt"], "--checkpoint-dir: checkpoints is relative and --pvc mounts"),
    (["--pvc", "ckpt", "--checkpoint-dir", "/"], "where no volume can go"),
    (["--pvc", "ckpt", "--checkpoint-dir", "/dev/shm/ckpt"], "where no volume can go"),
    (["--data-pvc", "corpus"], "--data-pvc: got corpus without --data"),
    (["--data", "/wiki.txt", "--data-pvc", "corpus"], "--data: /wiki.txt: --data-pvc mounts"),
    (["--checkpoint-dir", "/data", "--pvc", "a", "--data", "/data/w.txt", "--data-pvc", "b"],
     "--data-pvc: b would be mounted at /data, where --pvc mounts a"),
])
def test_a_claim_with_nowhere_to_go_is_refused_in_one_line(tmp_path: Path, capsys,
                                                          args: list[str], words: str):
    code, err = _export(tmp_path, capsys, *args)
    assert code == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("flag", ["--pvc", "--data-pvc"])
def test_the_claims_are_refused_by_targets_without_pods(tmp_path: Path, capsys, flag: str):
    plan = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    assert main(["export", str(plan), "--to", "slurm", flag, "ckpt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}: --to slurm writes no" in err
