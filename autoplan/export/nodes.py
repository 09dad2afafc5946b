"""The machine an export writes its job for: the plan's profile with nodes of the size written
(--gpus-per-node), and the model-parallel groups that size splits across nodes. The price and
the memory check of an export are of this machine, not of the profile's own node size."""

from __future__ import annotations

import dataclasses

import numpy as np

from autoplan.cost import comm
from autoplan.hardware import ClusterProfile, ClusterSpec, load_profile
from autoplan.plan import Plan

NODE_SIZE_ENV = "AUTOPLAN_GPUS_PER_NODE"
"""Set by an elastic export (slurm, kubernetes) to the GPUs per node it writes, so that
`autoplan train --elastic` re-plans on the nodes the job runs on (runtime/elastic.py), as the
export priced and memory-checked them, not on the profile's node size."""


def profile_on_nodes(ref: str, gpus_per_node: int | None) -> ClusterProfile:
    """Profile `ref` with nodes of `gpus_per_node` GPUs (None: its own); raises ConfigError
    where it does not load here (another site's)."""
    profile = load_profile(ref, flag="cluster.profile")
    if gpus_per_node is not None and profile.gpus_per_node != gpus_per_node:
        profile = dataclasses.replace(profile, gpus_per_node=gpus_per_node)
    return profile


def written_cluster(plan: Plan, gpus_per_node: int) -> ClusterSpec:
    """The plan's profile on nodes of `gpus_per_node` GPUs, as the job is written; raises
    ConfigError where the profile does not load here (another site's)."""
    return ClusterSpec(profile_on_nodes(plan.cluster.profile, gpus_per_node),
                       plan.cluster.num_gpus)


def node_groups(plan: Plan) -> dict[str, tuple[int, int]]:
    """The model-parallel groups the cost model prices over the intra-node links while they fit
    in one node, as (stride, size) in its rank order (cost.comm: tp innermost, then cp; an
    expert group of ep ranks etp apart, cost.moe); groups of one rank left out."""
    p = plan.parallel
    groups: dict[str, tuple[int, int]] = {}
    if p.tp > 1:
        groups[f"tp {p.tp}"] = (1, p.tp)
    if p.cp > 1:
        groups[f"tp {p.tp} x cp {p.cp}" if p.tp > 1 else f"cp {p.cp}"] = (p.tp, p.cp)
    if p.ep * p.etp > 1:
        groups[f"ep {p.ep} x etp {p.etp}"] = (p.etp, p.ep)
    return groups


def split_groups(plan: Plan, profile_gpus_per_node: int, gpus_per_node: int) -> list[str]:
    """The groups of node_groups inside one node of the profile's size that a node of
    `gpus_per_node` GPUs no longer holds: their traffic crosses the inter-node links."""
    def inside(stride: int, size: int, per_node: int) -> bool:  # the cost model's placement
        return bool(comm.intra_node(np.asarray(stride), np.asarray(size), per_node))

    return [name for name, (stride, size) in node_groups(plan).items()
            if inside(stride, size, profile_gpus_per_node)
            and not inside(stride, size, gpus_per_node)]


def split_warning(plan: Plan, profile_gpus_per_node: int, gpus_per_node: int) -> str | None:
    """One line on the groups split_groups finds, or None when every one still fits."""
    split = split_groups(plan, profile_gpus_per_node, gpus_per_node)
    if not split:
        return None
    one = len(split) == 1
    return (f"--gpus-per-node {gpus_per_node}: {', '.join(split)} no longer fit"
            f"{'s' if one else ''} inside one node ({plan.cluster.profile} has "
            f"{profile_gpus_per_node} GPUs per node), so {'its' if one else 'their'} traffic "
            f"crosses the inter-node links, as priced below; to keep {'it' if one else 'them'} "
            "inside a node, plan for "
            f"nodes of {gpus_per_node} GPUs (`autoplan search` on a profile with "
            f"gpus_per_node: {gpus_per_node})")


def bigger_node_warning(profile: str, profile_gpus_per_node: int, gpus_per_node: int
                        ) -> str | None:
    """One line when the nodes written are larger than the profile's: priced with its
    intra-node links across more GPUs and its host memory shared by more ranks than any node
    it describes (nothing says such a node has either)."""
    if gpus_per_node <= profile_gpus_per_node:
        return None
    return (f"--gpus-per-node {gpus_per_node}: nodes larger than {profile}'s "
            f"{profile_gpus_per_node} GPUs, priced with its intra-node links across "
            f"{gpus_per_node} GPUs and its host memory per node, which describe no such node; "
            "measure one (`autoplan profile`) or give a profile of it to price it")
