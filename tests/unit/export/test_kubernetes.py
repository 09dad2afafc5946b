"""Kubernetes export, checked against the published API models: the Kubeflow Trainer SDK's
models (kubeflow-trainer-api: TrainJob, JobSet and the core Kubernetes types they embed) and the
training-operator SDK's (kubeflow-training: PyTorchJob, with the kubernetes client's pod types).
The container command runs under bash with torchrun stubbed; torchrun's parser reads it."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.kubernetes import PLAN_ENV, PLAN_FILE, PROFILE_ENV, PROFILE_FILE
from autoplan.export.registry import get_target
from autoplan.plan import ClusterRef
from autoplan.plan_files import load_plan

from .cases import CASES
from .consumers import run_script

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "kubernetes" in ok]
KINDS = ("trainjob", "pytorchjob", "jobset")


def _manifest(case: str, kind: str, **kw: Any) -> tuple[str, dict]:
    p = CASES[case][0]
    files = export_plan(
        get_target("kubernetes"),
        p,
        p.model_spec(),
        ExportOptions(gpus_per_node=8, k8s_kind=kind, **kw),
    )
    [text] = files.values()
    return text, yaml.safe_load(text)


def check_pydantic(model: Any, doc: dict) -> None:
    """The SDK model parses the document and writes back exactly it (unknown keys would drop)."""
    assert model.from_dict(doc).to_dict() == doc


def check_openapi(data: Any, type_name: str, where: str = "") -> Any:
    """Walk an openapi-generator (v1 client style) model: unknown keys, types, required fields."""
    if type_name.startswith("list["):
        assert isinstance(data, list), where
        return [check_openapi(v, type_name[5:-1], f"{where}[{i}]") for i, v in enumerate(data)]
    if type_name.startswith("dict("):
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        assert isinstance(data, dict), where
        return {k: check_openapi(v, inner, f"{where}.{k}") for k, v in data.items()}
    scalars = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if type_name in scalars:
        assert isinstance(data, scalars[type_name]) and not (
            type_name == "int" and isinstance(data, bool)
        ), f"{where}: {data!r} is not {type_name}"
        return data
    if type_name == "object":
        return data
    training = pytest.importorskip("kubeflow.training.models")
    client = pytest.importorskip("kubernetes.client.models")
    cls = getattr(training, type_name, None) or getattr(client, type_name)
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = set(data) - set(by_json)
    assert not unknown, f"{where}: {type_name} has no {sorted(unknown)}"
    kwargs = {
        by_json[k]: check_openapi(v, cls.openapi_types[by_json[k]], f"{where}.{k}")
        for k, v in data.items()
    }
    return cls(**kwargs)  # raises ValueError for a missing required field


def validate(kind: str, doc: dict) -> None:
    if kind == "pytorchjob":
        check_openapi(doc, "KubeflowOrgV1PyTorchJob")
        return
    models = pytest.importorskip("kubeflow_trainer_api.models")
    model = {"trainjob": models.TrainerV1alpha1TrainJob, "jobset": models.JobsetV1alpha2JobSet}
    check_pydantic(model[kind], doc)


def _containers(kind: str, doc: dict) -> list[dict]:
    if kind == "trainjob":
        return [doc["spec"]["trainer"]]
    if kind == "pytorchjob":
        return [
            r["template"]["spec"]["containers"][0]
            for r in doc["spec"]["pytorchReplicaSpecs"].values()
        ]
    return [
        doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    ]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_manifest_matches_the_published_api(case: str, kind: str):
    _, doc = _manifest(case, kind, namespace="ml")
    validate(kind, doc)
    p = CASES[case][0]
    nodes = -(-p.world_size // 8)
    gpus = p.world_size // nodes
    for container in _containers(kind, doc):
        limits = container.get("resources", container.get("resourcesPerNode", {}))["limits"]
        assert limits == {"nvidia.com/gpu": str(gpus)}
    if kind == "trainjob":
        assert (doc["spec"]["trainer"]["numNodes"], doc["spec"]["trainer"]["numProcPerNode"]) == (
            nodes,
            gpus,
        )
    elif kind == "pytorchjob":
        specs = doc["spec"]["pytorchReplicaSpecs"]
        assert sum(r["replicas"] for r in specs.values()) == nodes
        assert doc["spec"]["nprocPerNode"] == str(gpus)
    else:
        assert doc["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == nodes


@pytest.mark.parametrize("kind", KINDS)
def test_container_writes_the_plan_and_runs_torchrun(tmp_path: Path, kind: str, monkeypatch):
    case = "megatron-3d"
    p = CASES[case][0]
    _, doc = _manifest(case, kind)
    container = _containers(kind, doc)[0]
    plan_file = tmp_path / "plan.yaml"
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    script = tmp_path / "entry.sh"
    script.write_text(command[2].replace(PLAN_FILE, str(plan_file)) + "\n")
    env = {e["name"]: e["value"] for e in container["env"]}
    monkeypatch.setenv(PLAN_ENV, env[PLAN_ENV])
    [call] = run_script(script, {"torchrun": ""})
    assert load_plan(plan_file) == p.replace(model=p.model_spec())
    if kind != "jobset":  # the Kubeflow operators pass nnodes/nproc/master as PET_* variables
        for name, value in (("PET_NNODES", "8"), ("PET_NPROC_PER_NODE", "8")):
            monkeypatch.setenv(name, value)
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(call[1:])
    assert int(args.nnodes) * int(args.nproc_per_node) == p.world_size
    assert [args.training_script, *args.training_script_args][:3] == [
        "autoplan",
        "train",
        str(plan_file),
    ]


def test_rendezvous_host_is_the_first_jobset_pod():
    text, doc = _manifest("megatron-3d", "jobset", job_name="llm")
    script = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
        0
    ]["command"][2]
    assert "--rdzv-endpoint=llm-node-0-0.llm:29500" in shlex.split(script.split("&&")[1])
    assert text.startswith("# JobSet written by")


def test_unknown_kind_is_refused():
    p = CASES["dp-zero1"][0]
    with pytest.raises(Exception, match="--kind"):
        export_plan(
            get_target("kubernetes"),
            p,
            p.model_spec(),
            ExportOptions(gpus_per_node=8, k8s_kind="deployment"),
        )


def test_elastic_pytorchjob_has_the_operators_elastic_policy():
    """#15 item 4: spec.elasticPolicy as kubeflow/training-operator's PyTorchJob defines it
    (pkg/apis/kubeflow.org/v1/pytorch_types.go: minReplicas, maxReplicas, rdzvBackend,
    maxRestarts), checked by the Kubeflow training SDK's own model; workers only, each running
    `autoplan train --elastic` with the GPU floor of minReplicas nodes."""
    _, doc = _manifest("megatron-3d", "pytorchjob", elastic=True, min_nodes=3)
    validate("pytorchjob", doc)
    nodes = CASES["megatron-3d"][0].world_size // 8
    assert doc["spec"]["elasticPolicy"] == {"minReplicas": 3, "maxReplicas": nodes,
                                            "rdzvBackend": "c10d", "maxRestarts": 3}
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == nodes
    [container] = _containers("pytorchjob", doc)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    words = shlex.split(container["command"][2].split("&&")[1])
    train = words[words.index("autoplan"):]
    assert "--elastic" in train and train[train.index("--min-gpus") + 1] == str(3 * 8)


def test_elastic_jobset_runs_torchrun_min_max():
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    _, doc = _manifest("megatron-3d", "jobset", elastic=True, min_nodes=2)
    validate("jobset", doc)
    [container] = _containers("jobset", doc)
    words = shlex.split(container["command"][2].split("&&")[1])
    args = get_args_parser().parse_args(words[2:])  # after `exec torchrun`
    nodes = CASES["megatron-3d"][0].world_size // 8
    assert parse_min_max_nnodes(args.nnodes) == (2, nodes) and args.rdzv_backend == "c10d"
    assert "--elastic" in args.training_script_args
    job = doc["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 3  # a failed pod comes back and rejoins


def test_elastic_trainjob_is_refused_with_the_kinds_that_can():
    p = CASES["dp-zero1"][0]
    with pytest.raises(Exception, match="pytorchjob or --kind jobset"):
        export_plan(get_target("kubernetes"), p, p.model_spec(),
                    ExportOptions(gpus_per_node=8, k8s_kind="trainjob", elastic=True))


@pytest.mark.parametrize("kind", KINDS)
def test_a_profile_the_image_cannot_find_travels_with_the_plan(tmp_path: Path, kind: str,
                                                               monkeypatch):
    """A plan priced on a profile file of this machine (a path here; `autoplan profile` writes
    such files) names a file no pod has: the manifest carries the profile, the script writes it
    before torchrun, and the plan it writes points at that copy."""
    from autoplan import resources
    from autoplan.hardware import load_profile

    builtin = resources.find(resources.PROFILES, "h100-sxm-80gb")
    assert builtin is not None
    mine = tmp_path / "site" / "my-h100.yaml"
    mine.parent.mkdir()
    mine.write_text(builtin.read_text())
    p = CASES["megatron-3d"][0]
    p = p.replace(cluster=ClusterRef(str(mine), p.cluster.num_gpus))
    [text] = export_plan(get_target("kubernetes"), p, p.model_spec(),
                         ExportOptions(gpus_per_node=8, k8s_kind=kind)).values()
    container = _containers(kind, yaml.safe_load(text))[0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) >= {PLAN_ENV, PROFILE_ENV}
    plan_file, profile_file = tmp_path / "plan.yaml", tmp_path / "profile.yaml"
    script = tmp_path / "entry.sh"
    script.write_text(container["command"][2].replace(PLAN_FILE, str(plan_file))
                      .replace(PROFILE_FILE, str(profile_file)) + "\n")
    for name in (PLAN_ENV, PROFILE_ENV):
        monkeypatch.setenv(name, env[name])
    run_script(script, {"torchrun": ""})
    written = load_plan(plan_file)
    assert written.cluster.profile == PROFILE_FILE
    assert load_profile(profile_file) == load_profile(mine)

    # a profile autoplan ships is found by name in the image: nothing extra travels
    _, doc = _manifest("megatron-3d", kind)
    assert PROFILE_ENV not in {e["name"] for e in _containers(kind, doc)[0]["env"]}
