"""Parallel dimensions of a plan and the named DeviceMesh built from them.

The world mesh has five named dimensions, outermost first: ("pp", "dp_replicate", "dp_shard",
"cp", "tp"). The plan's `dp` is split, as in torchtitan's HSDP, into a replicated part and a
sharded part: ZeRO-0 replicates over all dp ranks (dp_replicate = dp, dp_shard = 1), ZeRO-1/2/3
shard over all of them (dp_replicate = 1, dp_shard = dp) or, with the plan's parallel.dp_shard
(HSDP), over groups of dp_shard (dp_replicate = dp / dp_shard). tp is innermost so TP groups are
consecutive ranks (one node), pp outermost. Nothing here is global: `ParallelDims` and the mesh
are passed explicitly to whoever needs them. Expert parallelism (`ep`, `etp`, MoE models) folds
into dp*cp*tp and gets its own mesh over the same ranks (expert_parallel.build_expert_mesh).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from autoplan.plan import Plan

MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of one job; world_size = pp * dp * cp * tp."""

    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    zero_stage: int = 0
    ep: int = 1
    """Expert-parallel degree (Megatron-Core folding: ep * etp divides dp*cp*tp);
    expert-DP = dp*cp*tp/(ep*etp)."""
    etp: int = 1
    """Expert tensor-parallel degree: each routed expert's FFN split over etp ranks."""
    hsdp_shard: int | None = None
    """Plan.parallel.dp_shard: ZeRO shard group size under HSDP; None shards over all of dp."""

    @classmethod
    def from_plan(cls, plan: Plan) -> ParallelDims:
        p = plan.parallel
        return cls(pp=p.pp, dp=p.dp, cp=p.cp, tp=p.tp, zero_stage=plan.zero_stage,
                   ep=getattr(p, "ep", 1), etp=getattr(p, "etp", 1), hsdp_shard=p.dp_shard)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def experts_sharded(self) -> bool:
        """Routed experts live on an expert mesh of their own (ep * etp > 1)."""
        return self.ep * self.etp > 1

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: dp*cp*tp / (ep*etp)."""
        return self.dp * self.cp * self.tp // (self.ep * self.etp)

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def dp_shard(self) -> int:
        if self.zero_stage == 0:
            return 1
        return self.dp if self.hsdp_shard is None else self.hsdp_shard

    @property
    def hsdp(self) -> bool:
        """ZeRO shards over part of dp and replicates across the rest (2-D FSDP2 mesh)."""
        return self.zero_stage >= 1 and self.dp_replicate > 1

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)


def build_mesh(dims: ParallelDims, device_type: str):  # -> DeviceMesh
    """The 5-D named world mesh over the default process group (init_device_mesh)."""
    from torch.distributed.device_mesh import init_device_mesh

    return with_world_timeout(init_device_mesh(device_type, dims.mesh_shape,
                                               mesh_dim_names=MESH_DIM_NAMES))


def with_world_timeout(mesh):  # DeviceMesh -> DeviceMesh
    """`mesh`, its groups given the default group's timeout.

    DeviceMesh creates each dimension's groups (and `_flatten` its flattened one) with
    torch's default timeout for the backend, 30 minutes for gloo and 10 for NCCL
    (distributed_c10d._get_default_timeout), not the one the job passed to
    init_process_group: a rank stuck in a tp, dp or pp collective would wait that long while
    one stuck in a world collective gives up after the job's timeout."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    set_timeout = getattr(c10d, "_set_pg_timeout", None)  # private: absent, the defaults stay
    world = c10d._get_default_group()
    options = [getattr(world._get_backend(torch.device(d)), "options", None)
               for d in ("cpu", "cuda") if torch.device(d) in world._device_types]
    timeouts = [o._timeout for o in options if o is not None and hasattr(o, "_timeout")]
    if set_timeout is None or not timeouts:  # no options: the fake backend of unit tests
        return mesh
    timeout = timeouts[0]
    for group in mesh.get_all_groups():
        if group is not world:
            set_timeout(timeout, group)
    return mesh


def coordinate(mesh, name: str) -> int:
    """This rank's index along the named mesh dimension."""
    return mesh.get_local_rank(name)


def dp_rank(mesh, dims: ParallelDims) -> int:
    """This rank's index among the dp replicas (replicate-major, then shard)."""
    return coordinate(mesh, "dp_replicate") * dims.dp_shard + coordinate(mesh, "dp_shard")


def pg_timeout(seconds: float = DEFAULT_TIMEOUT_S) -> datetime.timedelta:
    """The finite timeout every process group gets: a rank-local failure cannot hang the job."""
    return datetime.timedelta(seconds=seconds)
