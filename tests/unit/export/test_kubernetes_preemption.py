"""A JobSet export survives evictions and preemptions without spending its restart budget: the
child Job's pod failure policy fails it on a DisruptionTarget pod, and a JobSet rule restarts on
that failure reason without counting toward maxRestarts (kubernetes-sigs/jobset's "Handling
Host Maintenance Events" pattern). TrainJob and PyTorchJob cannot carry either, and their
headers say so. Checked against the published API models (test_kubernetes.validate)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target

from .cases import CASES
from .test_kubernetes import check_openapi, validate

CASE = "megatron-3d"


def _manifest(kind: str, **kw: Any) -> tuple[str, dict]:
    p = CASES[CASE][0]
    opts = ExportOptions(gpus_per_node=8, k8s_kind=kind, **kw)
    [text] = export_plan(get_target("kubernetes"), p, p.model_spec(), opts).values()
    doc = yaml.safe_load(text)
    validate(kind, doc)  # the published API models read every field written
    return text, doc


def _header(text: str) -> str:
    """The header comment as one line of prose."""
    lines = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    return " ".join(lines)


@pytest.mark.parametrize("elastic", [False, True])
def test_jobset_restarts_on_eviction_without_counting_it(elastic: bool):
    kw: dict[str, Any] = {"max_restarts": 5}
    if elastic:
        kw |= {"elastic": True, "min_nodes": 2}
    _, doc = _manifest("jobset", **kw)
    [rjob] = doc["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert job["podFailurePolicy"] == {"rules": [{
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }]}
    # the API refuses a pod failure policy beside any other restartPolicy
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    policy = doc["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 5  # crashes keep their budget
    [rule] = policy["rules"]
    assert rule["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert "targetReplicatedJobs" not in rule  # the one replicated job, `node`, as any
    # a crash must not match: no rule without reasons, none on exit codes
    assert all(r.get("onJobFailureReasons") for r in policy["rules"])
    assert all("onExitCodes" not in r for r in job["podFailurePolicy"]["rules"])


def test_jobset_failure_rules_are_the_apis_own_words():
    """Enum values the SDK models leave unchecked (plain strings), held to the published
    descriptions of the fields, and the Job spec read by the kubernetes client's batch/v1
    model, which knows podFailurePolicy (required fields, no unknown keys)."""
    models = pytest.importorskip("kubeflow_trainer_api.models")
    _, doc = _manifest("jobset")
    [rule] = doc["spec"]["failurePolicy"]["rules"]
    fields = models.JobsetV1alpha2FailurePolicyRule.model_fields
    assert rule["action"] in fields["action"].description.replace(",", " ").split()
    name = re.search(r'"(\^.*?\$)"', fields["name"].description)  # the name's pattern
    assert name is not None and re.fullmatch(name.group(1), rule["name"])
    job = doc["spec"]["replicatedJobs"][0]["template"]["spec"]
    check_openapi(job, "V1JobSpec")
    pod_rule = models.IoK8sApiBatchV1PodFailurePolicyRule.model_fields["action"].description
    assert "- FailJob:" in pod_rule


@pytest.mark.parametrize("elastic", [False, True])
def test_jobset_header_says_what_evictions_cost_and_what_it_needs(elastic: bool):
    kw: dict[str, Any] = {"elastic": True, "min_nodes": 2} if elastic else {}
    text, _ = _manifest("jobset", **kw)
    header = _header(text)
    for needed in ("condition DisruptionTarget", "spec.podFailurePolicy (FailJob",
                   "Kubernetes 1.26 or later, GA in 1.31", "restartPolicy Never",
                   "RestartJobSetAndIgnoreMaxRestarts (JobSet v0.6.0 or later)",
                   "never spend failurePolicy.maxRestarts 3",
                   "kubernetes/api batch/v1/types.go PodFailurePolicy (8b76f66a8775)",
                   "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go "
                   "FailurePolicyRule (0336a8fd9fd3)",
                   "No rule reads exit codes",
                   # kubelet node-pressure eviction sets DisruptionTarget too: said, and how to
                   # see a job that outgrows its node restarting without limit
                   "evicts for its own memory use", "restarts without limit",
                   "status.restarts growing while status.restartsCountTowardsMax does not"):
        assert needed in header, needed


@pytest.mark.parametrize(("kind", "says"), [
    ("trainjob", "a TrainJob carries no pod failure policy or JobSet failure rules"),
    ("pytorchjob", "a kubeflow.org/v1 PyTorchJob has no pod failure policy"),
])
def test_kinds_without_a_pod_failure_policy_say_so_and_write_none(kind: str, says: str):
    text, doc = _manifest(kind)
    header = _header(text)
    assert f"Evictions and preemptions are handled as crashes: {says}" in header
    assert "--kind jobset" in header.split("Evictions and preemptions")[1]
    written = yaml.safe_dump(doc)
    assert "podFailurePolicy" not in written and "DisruptionTarget" not in written
    assert "failurePolicy" not in written


@pytest.mark.dist  # torchrun and its rank: under pytest-xdist it hung past the signal in 2
@pytest.mark.timeout(120)  # of 3 runs (stdin closed or not), never in one process: run alone
def test_torchrun_exits_1_after_passing_sigterm_on_though_its_rank_exits_0(tmp_path: Path):
    """Why no rule reads exit codes: the pod's container runs `exec torchrun`, and torchrun,
    SIGTERMed (an eviction), passes the signal on, waits for its rank, which saves and exits 0,
    and then exits 1 itself, as after a crash. The rank here SIGTERMs its torchrun (its
    parent) once it has its handler, so nothing depends on timing."""
    pytest.importorskip("torch.distributed.run")
    text, doc = _manifest("jobset")
    script = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"][2]
    assert " && exec torchrun " in script  # torchrun's status is the container's
    rank = tmp_path / "rank.sh"
    rank.write_text("#!/bin/sh\n"
                    "trap 'echo saved > \"$0.saved\"; exit 0' TERM\n"
                    "kill -TERM \"$PPID\"\n"
                    "while :; do sleep 0.1; done\n")
    rank.chmod(rank.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
         "--no-python", str(rank)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=110, stdin=subprocess.DEVNULL)
    assert (tmp_path / "rank.sh.saved").read_text() == "saved\n"  # the rank ended cleanly
    assert done.returncode == 1, done.stderr[-2000:]
    assert "SignalException" in done.stderr
