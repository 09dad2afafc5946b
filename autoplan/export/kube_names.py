"""The names a Kubernetes export writes, checked as the cluster will: a namespace, and a job
name whose pods and Services (named after it, per kind) the API server and JobSet accept."""

from __future__ import annotations

import re

from autoplan.errors import ConfigError
from autoplan.export.base import Layout

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_RULE = ("an RFC 1123 DNS label: at most 63 characters, lowercase letters, digits and '-',"
                " starting and ending with a letter or digit")
"""Kubernetes, "Object Names and IDs" (kubernetes.io/docs/concepts/overview/working-with-objects/
names): namespaces must be RFC 1123 labels."""
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63
POD_SUFFIX = "-abcde"
"""The 5 random characters a Job's pod name ends in, as JobSet's webhook counts them."""


def check_dns_label(flag: str, value: str) -> None:
    """Refuse a name that is not a DNS-1123 label."""
    if not DNS1123_LABEL.fullmatch(value) or len(value) > LABEL_MAX:
        raise ConfigError(flag, f"got {value[:80]!r}", f"it must be {DNS1123_RULE}")


def longest_derived_name(name: str, kind: str, lay: Layout, elastic: bool) -> str:
    """The longest name the cluster derives from the job's, which must be an RFC 1035 label.

    JobSet's webhook (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go ValidateCreate)
    refuses a JobSet whose longest pod name, <jobset>-<replicated job>-<max job index>-<max pod
    index>-abcde, is not one; a TrainJob is run as a JobSet named after it, whose replicated job
    `node` (the torch-distributed runtime's) has numNodes pods. A PyTorchJob's pods and their
    Services are <job>-master-0 and <job>-worker-<i> (training-operator), and a Service name
    is an RFC 1035 label."""
    if kind == "pytorchjob":
        workers = lay.num_nodes if elastic else lay.num_nodes - 1
        names = [] if elastic else [f"{name}-master-0"]
        if workers:
            names.append(f"{name}-worker-{workers - 1}")
        return max(names, key=len)
    return f"{name}-node-0-{lay.num_nodes - 1}{POD_SUFFIX}"  # one Job (index 0) of num_nodes pods


def check_k8s_job_name(name: str, kind: str, lay: Layout, elastic: bool) -> None:
    """Refuse a --job-name whose object, pods or Services the cluster would refuse."""
    longest = longest_derived_name(name, kind, lay, elastic)
    if DNS1035_LABEL.fullmatch(name) and len(longest) <= LABEL_MAX:
        return
    limit = LABEL_MAX - (len(longest) - len(name))
    example = longest if len(name) <= 80 else f"{name[:20]}...{longest[len(name):]}"
    raise ConfigError(
        "--job-name", f"got {name[:80]!r} ({len(name)} characters)",
        f"with --kind {kind} on {lay.num_nodes} node(s) its longest pod name is {example}, which "
        f"must be an RFC 1035 label of at most {LABEL_MAX} characters: give at most {limit} "
        "lowercase letters, digits and '-', starting with a letter, ending with a letter or digit")
