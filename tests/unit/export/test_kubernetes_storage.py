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
from autoplan.plan import ClusterRef
from autoplan.plan_files import save_plan

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


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_one_claim_for_both_is_one_volume_mounted_twice(kind: str):
    """A pod's container lists its mounts by mountPath: one volume at two folders is the
    documented way to mount one claim twice (two volumes of one claim can leave the pod
    waiting on its mounts, kubernetes/kubernetes#127004)."""
    _, doc = _manifest(kind, checkpoint_dir="/store/ckpt", pvc="store",
                       data="/store/text/wiki.txt", data_pvc="store")
    for volumes, mounts, _ in _pods(kind, doc):
        assert volumes[1:] == [{"name": "checkpoints",
                                "persistentVolumeClaim": {"claimName": "store"}}]
        assert mounts[1:] == [{"name": "checkpoints", "mountPath": "/store/ckpt"},
                              {"name": "checkpoints", "mountPath": "/store/text",
                               "readOnly": True}]


def test_a_trainjob_refuses_one_claim_at_two_folders_and_takes_it_at_one(tmp_path: Path,
                                                                          capsys):
    """A TrainJob's runtimePatches list a container's mounts by volume name (kubeflow/trainer
    ContainerPatch.VolumeMounts: +listType=map +listMapKey=name): the same claim at /ckpt and
    /data was two mounts named `checkpoints`, a duplicate key the API server refuses."""
    code, err = _export(tmp_path, capsys, "--checkpoint-dir", "/store/ckpt", "--pvc", "store",
                        "--data", "/store/text/wiki.txt", "--data-pvc", "store")
    assert code == 2 and err.count("\n") == 1
    assert "--data-pvc: store is --pvc's claim too, mounted at /store/ckpt" in err
    assert "--kind jobset or --kind pytorchjob" in err
    # the text in the checkpoint folder: one mount, read-write, which a TrainJob can write
    _, doc = _manifest("trainjob", checkpoint_dir="/store", pvc="store",
                       data="/store/wiki.txt", data_pvc="store")
    [(volumes, mounts, _)] = _pods("trainjob", doc)
    assert mounts[1:] == [{"name": "checkpoints", "mountPath": "/store"}]
    assert [v["name"] for v in volumes] == ["dshm", "checkpoints"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("claims", [
    {"pvc": "a", "data_pvc": "b"}, {"pvc": "a"}, {"data_pvc": "b"},
    {"pvc": "a", "data_pvc": "a", "data": "/ckpt/wiki.txt"},
])
def test_every_list_the_api_keys_holds_each_key_once(kind: str, claims: dict[str, str]):
    """The API server refuses a duplicate key in a list-map: a pod's volumes by name, its
    container's mounts by mountPath (core/v1), a TrainJob patch's mounts by name."""
    claims = {"data": "/corpus/wiki.txt", **claims}
    _, doc = _manifest(kind, checkpoint_dir="/ckpt", **claims)
    for volumes, mounts, _ in _pods(kind, doc):
        names = [v["name"] for v in volumes]
        assert len(set(names)) == len(names)
        key = "name" if kind == "trainjob" else "mountPath"
        assert len({m[key] for m in mounts}) == len(mounts)
        assert {m["name"] for m in mounts} <= set(names)


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
    # over the plan the pod's script writes: read-only, the write fails; read-write, hidden
    (["--data", "/tmp/corpus.txt", "--data-pvc", "corpus"],
     "--data: /tmp/corpus.txt: --data-pvc mounts the claim at its folder, /tmp, over "
     "/tmp/autoplan-plan.yaml, where the pod's script writes the plan"),
    (["--pvc", "ckpt", "--checkpoint-dir", "/tmp"], "/tmp, over /tmp/autoplan-plan.yaml"),
    (["--pvc", "ckpt", "--checkpoint-dir", "//tmp/"], "//tmp, over /tmp/autoplan-plan.yaml"),
    (["--pvc", "ckpt", "--checkpoint-dir", "/tmp/autoplan-plan.yaml/x"],
     "over /tmp/autoplan-plan.yaml"),
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


def test_a_claim_beside_the_plans_file_is_mounted():
    """/tmp/ckpt covers no file the pod's script writes: mounted as asked."""
    _, doc = _manifest("jobset", checkpoint_dir="/tmp/ckpt", pvc="ckpt")
    [(_, mounts, _)] = _pods("jobset", doc)
    assert mounts[1:] == [{"name": "checkpoints", "mountPath": "/tmp/ckpt"}]
    assert "/tmp/autoplan-plan.yaml before torchrun starts" in _header(_manifest(
        "jobset", checkpoint_dir="/tmp/ckpt", pvc="ckpt")[0])


def _shipped_profile_plan(tmp_path: Path, monkeypatch, where: str) -> tuple[Any, str]:
    """dp-zero1 on a copy of h100-sxm-80gb the image cannot find: a path, or a name found in
    the user's profile folder (what `autoplan profile` writes)."""
    from autoplan import resources

    builtin = resources.find(resources.PROFILES, "h100-sxm-80gb")
    assert builtin is not None
    folder = tmp_path / "profiles"
    folder.mkdir()
    text = builtin.read_text().replace("name: h100-sxm-80gb", "name: my-h100")
    assert "name: my-h100" in text
    (folder / "my-h100.yaml").write_text(text)
    if where == "path":
        ref = str(folder / "my-h100.yaml")
    else:
        monkeypatch.setenv("AUTOPLAN_PROFILES", str(folder))
        ref = "my-h100"
    plan = CASES["dp-zero1"][0]
    return plan.replace(cluster=ClusterRef(ref, plan.cluster.num_gpus)), ref


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["path", "user folder"])
def test_a_profile_that_travels_in_the_manifest_sizes_the_pods_and_is_named(
        tmp_path: Path, monkeypatch, kind: str, where: str):
    """The memory request was worked out after the plan was pointed at the pod's copy
    (/tmp/autoplan-profile.yaml), which does not load here: no request, and a header naming
    that copy, for every profile `autoplan profile` writes."""
    plan, ref = _shipped_profile_plan(tmp_path, monkeypatch, where)
    opts = LaunchOptions(gpus_per_node=8, k8s_kind=kind)
    [text] = export_plan(get_target("kubernetes"), plan, plan.model_spec(), opts).values()
    doc = yaml.safe_load(text)
    validate(kind, doc)
    expected = int(load_profile(ref).host.memory_bytes * MEMORY_SHARE) // 2**30
    for _, _, resources in _pods(kind, doc):
        assert resources["requests"] == {"memory": f"{expected}Gi"}
    header = _header(text)
    assert f"memory request {expected}Gi, 75% of profile {ref}'s host memory" in header
    assert f"The plan and profile {ref} travel in the manifest" in header
    assert "profile /tmp/autoplan-profile.yaml" not in header


@pytest.mark.parametrize("gpus_per_node, pod_gpus, share", [(4, 4, 0.5), (16, 16, 1.0)])
def test_the_memory_request_is_the_pods_share_of_the_profiles_node(gpus_per_node: int,
                                                                  pod_gpus: int, share: float):
    """--gpus-per-node 4 requested 1536Gi, all of an 8-GPU node's share, for 4 GPUs; a node
    larger than the profile's gets one node's share, as the price gives it one node's host
    memory."""
    plan = CASES["dp-zero1"][0]
    opts = LaunchOptions(gpus_per_node=gpus_per_node, k8s_kind="jobset")
    [text] = export_plan(get_target("kubernetes"), plan, plan.model_spec(), opts).values()
    [(_, _, resources)] = _pods("jobset", yaml.safe_load(text))
    host = load_profile("h100-sxm-80gb").host.memory_bytes
    expected = int(host * share * MEMORY_SHARE) // 2**30
    assert resources == {"requests": {"memory": f"{expected}Gi"},
                         "limits": {"nvidia.com/gpu": str(pod_gpus)}}
    header = _header(text)
    assert f"memory request {expected}Gi" in header
    assert "75% of profile h100-sxm-80gb's host memory (2048 GiB of a node of 8 GPUs)" in header
    assert f"for the pod's {pod_gpus} GPUs" in header
