"""`export --to kubernetes --job-name`: only names the cluster takes, for every --kind.

The job's name begins every name the cluster derives from it: JobSet's webhook refuses a JobSet
whose longest pod name, <jobset>-<replicated job>-<max job index>-<max pod index>-abcde, is not an
RFC 1035 label (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go); a TrainJob runs as such
a JobSet (replicated job `node`, numNodes pods); a PyTorchJob's pods and Services are
<name>-master-0 and <name>-worker-<i>. The limits here are read off the rendered manifest.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.plan import Batch, Parallel
from autoplan.plan_files import save_plan

from .cases import plan

RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
NODES = (2, 16)
"""Node counts of the plans below (8 GPUs a node): one- and two-digit pod indices."""


def _plan_file(tmp_path: Path, nodes: int) -> Path:
    gpus = 8 * nodes
    p = plan(gpus=gpus, parallel=Parallel(dp=gpus), zero_stage=1, batch=Batch(1, 8 * gpus))
    return save_plan(p, tmp_path / f"plan{nodes}.yaml", overwrite=True)


def _derived_names(doc: dict) -> list[str]:
    """Every pod (and PyTorchJob Service) name the cluster makes for the manifest, each Job pod
    with JobSet's 5-character stand-in for its random suffix."""
    name, spec = doc["metadata"]["name"], doc["spec"]
    if doc["kind"] == "TrainJob":  # a JobSet of one Job, `node`, with numNodes pods
        return [f"{name}-node-0-{i}-abcde" for i in range(spec["trainer"]["numNodes"])]
    if doc["kind"] == "JobSet":
        return [f"{name}-{rj['name']}-{j}-{i}-abcde" for rj in spec["replicatedJobs"]
                for j in range(rj["replicas"]) for i in range(rj["template"]["spec"]["completions"])]
    return [f"{name}-{kind.lower()}-{i}" for kind, rs in spec["pytorchReplicaSpecs"].items()
            for i in range(rs["replicas"])]


def _export(plan_file: Path, kind: str, name: str, *extra: str) -> int:
    return main(["export", str(plan_file), "--to", "kubernetes", "--kind", kind,
                 "--job-name", name, *extra])


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("kind, extra", [("trainjob", ()), ("jobset", ()), ("pytorchjob", ()),
                                         ("jobset", ("--elastic",)),
                                         ("pytorchjob", ("--elastic",))])
def test_the_longest_name_taken_makes_names_the_cluster_takes(tmp_path: Path, capsys, kind: str,
                                                              extra: tuple[str, ...],
                                                              nodes: int) -> None:
    plan_file = _plan_file(tmp_path, nodes)
    taken = None
    for length in range(63, 0, -1):  # the longest name export takes
        if _export(plan_file, kind, "a" * length, *extra) == 0:
            taken = length
            break
    assert taken is not None
    doc = yaml.safe_load(capsys.readouterr().out)
    names = _derived_names(doc)
    assert names and all(RFC1035.fullmatch(n) and len(n) <= 63 for n in names), names
    assert max(len(n) for n in names) == 63  # one character more would not fit: the limit
    assert _export(plan_file, kind, "a" * (taken + 1), *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--job-name" in err and "a" * (taken + 1) in err
    assert f"at most {taken} " in err and "63" in err


@pytest.mark.parametrize("kind", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.parametrize("name", ["1abc", "9-job"])
def test_a_name_starting_with_a_digit_is_refused(tmp_path: Path, capsys, kind: str,
                                                name: str) -> None:
    """Services and JobSet pod names are RFC 1035 labels, which start with a letter."""
    plan_file = _plan_file(tmp_path, 2)
    out = tmp_path / "job.yaml"
    assert _export(plan_file, kind, name, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--job-name: got {name!r}" in err and "RFC 1035" in err
    assert "starting with a letter" in err and not out.exists()
