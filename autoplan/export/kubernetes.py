"""`--to kubernetes`: the job as a Kubeflow Trainer v2 TrainJob (default), a legacy Kubeflow
PyTorchJob, or a plain JobSet; each node runs torchrun, which runs `autoplan train PLAN`.

The plan travels inside the manifest (an environment variable written to a file at start), with
its model spec inlined, so the image needs autoplan but no copy of the plan.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, ExportTarget, Layout, layout, layout_reasons
from autoplan.export.launch import check_path_word, shell_join, torchrun_argv, train_argv
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, plan_to_dict
from autoplan.yaml_io import dump_yaml

KINDS = ("trainjob", "pytorchjob", "jobset")
PLAN_ENV = "AUTOPLAN_PLAN_YAML"
PLAN_FILE = "/tmp/autoplan-plan.yaml"
GPU_RESOURCE = "nvidia.com/gpu"
TRAINER_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch (torchrun) jobs."""
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_RULE = ("an RFC 1123 DNS label: at most 63 characters, lowercase letters, digits and '-',"
                " starting and ending with a letter or digit")
"""Kubernetes, "Object Names and IDs" (kubernetes.io/docs/concepts/overview/working-with-objects/
names): namespaces must be RFC 1123 labels; the job's name is also the prefix of its pods' host
names and Services (JobSet, the Kubeflow operators), which are labels too, so it obeys the same
rule (stricter than the 253-character DNS subdomain most objects allow)."""


def check_dns_label(flag: str, value: str, *, suffix: str = "") -> None:
    """Refuse a name that is not a DNS-1123 label (with `suffix` appended where it must fit)."""
    if not DNS1123_LABEL.fullmatch(value) or len(value + suffix) > 63:
        extra = f" (with {suffix!r} appended for the pods' host names)" if suffix else ""
        raise ConfigError(flag, f"got {value[:80]!r}", f"it must be {DNS1123_RULE}{extra}")


def _script(torchrun: list[str], opts: ExportOptions) -> str:
    """sh -c text: write the plan from the environment, then exec torchrun on it."""
    write = f'printf "%s\\n" "${PLAN_ENV}" > {PLAN_FILE}'
    # only torchrun's own words may hold $(...) expansions; the user's values are single-quoted
    run = shell_join(["exec", *torchrun], keep=("$(",)) + " " + shell_join(
        train_argv(opts, PLAN_FILE))
    return f"{write} && {run}"


def _container(name: str, script: str, plan_yaml: str, opts: ExportOptions, gpus: int) -> dict:
    return {
        "name": name,
        "image": opts.image,
        "command": ["/bin/sh", "-c", script],
        "env": [{"name": PLAN_ENV, "value": plan_yaml}],
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }


def _metadata(opts: ExportOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": opts.job_name, "labels": {"app.kubernetes.io/name": "autoplan"}}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return meta


def train_job(lay: Layout, plan_yaml: str, opts: ExportOptions) -> dict[str, Any]:
    """TrainJob (trainer.kubeflow.org/v1alpha1); the torch runtime sets torchrun's PET_* env."""
    script = _script(["torchrun", f"--max-restarts={opts.max_restarts}", "--no-python"], opts)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(opts),
        "spec": {
            "runtimeRef": {"name": TRAINER_RUNTIME},
            "trainer": {
                "image": opts.image,
                "command": ["/bin/sh", "-c", script],
                "env": [{"name": PLAN_ENV, "value": plan_yaml}],
                "numNodes": lay.num_nodes,
                "numProcPerNode": lay.nproc_per_node,
                "resourcesPerNode": {"limits": {GPU_RESOURCE: str(lay.nproc_per_node)}},
            },
        },
    }


def pytorch_job(lay: Layout, plan_yaml: str, opts: ExportOptions) -> dict[str, Any]:
    """PyTorchJob (kubeflow.org/v1): the operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_*."""
    script = _script(["torchrun", f"--max-restarts={opts.max_restarts}", "--no-python"], opts)

    def replica(n: int) -> dict[str, Any]:  # a container per replica: no YAML aliases
        container = _container("pytorch", script, plan_yaml, opts, lay.nproc_per_node)
        template = {"spec": {"containers": [container]}}
        return {"replicas": n, "restartPolicy": "OnFailure", "template": template}

    specs = {"Master": replica(1)}
    if lay.num_nodes > 1:
        specs["Worker"] = replica(lay.num_nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(opts),
        "spec": {
            "nprocPerNode": str(lay.nproc_per_node),
            "pytorchReplicaSpecs": specs,
            "runPolicy": {"cleanPodPolicy": "None"},  # required by the v1 API
        },
    }


def job_set(lay: Layout, plan_yaml: str, opts: ExportOptions) -> dict[str, Any]:
    """JobSet (jobset.x-k8s.io/v1alpha2): one Indexed Job of num_nodes pods, c10d on pod 0."""
    head = f"{opts.job_name}-node-0-0.{opts.job_name}"  # <jobset>-<rjob>-<job>-<pod>.<subdomain>
    torchrun = torchrun_argv(lay, opts, rdzv_host=head, rdzv_id=opts.job_name)
    if "--standalone" in torchrun:  # one pod: keep the same c10d form as several
        torchrun = torchrun_argv(
            Layout(1, lay.nproc_per_node), opts, rdzv_host=head, rdzv_id=opts.job_name
        )
    container = _container("trainer", _script(torchrun, opts), plan_yaml, opts, lay.nproc_per_node)
    job_spec = {
        "parallelism": lay.num_nodes,
        "completions": lay.num_nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(opts),
        "spec": {
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {"maxRestarts": opts.max_restarts},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


BUILDERS = {"trainjob": train_job, "pytorchjob": pytorch_job, "jobset": job_set}


class KubernetesTarget(ExportTarget):
    name = "kubernetes"
    summary = "Kubernetes manifest: Kubeflow TrainJob (default), PyTorchJob or JobSet (--kind)"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        # JobSet pods are named <jobset>-<replicated job>-<job index>-<pod index>
        check_dns_label("--job-name", opts.job_name,
                        suffix="-node-0-0" if opts.k8s_kind == "jobset" else "")
        if opts.namespace is not None:
            check_dns_label("--namespace", opts.namespace)
        check_path_word("--checkpoint-dir", opts.checkpoint_dir)
        check_path_word("--image", opts.image)
        why = layout_reasons(plan, opts.gpus_per_node)
        if opts.k8s_kind not in KINDS:
            why.append(f"--kind {opts.k8s_kind!r}: choose one of {', '.join(KINDS)}")
        return why

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        plan_yaml = dump_yaml(plan_to_dict(plan.replace(model=model)))
        manifest = BUILDERS[opts.k8s_kind](lay, plan_yaml, opts)
        header = (
            f"# {manifest['kind']} written by `autoplan export --to kubernetes`: "
            f"{lay.num_nodes} node(s) x {lay.nproc_per_node} GPU(s).\n"
            f"# Checkpoints go to {opts.checkpoint_dir}: mount persistent storage there.\n"
        )
        body = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False, width=100)
        return {f"{opts.job_name}-{opts.k8s_kind}.yaml": header + body}
