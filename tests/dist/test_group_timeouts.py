"""Every process group the runtime makes carries the job's timeout.

DeviceMesh builds its dimension groups (and `_flatten` its flattened ones) with torch's
default timeout, 30 minutes under gloo, whatever init_process_group was given; a rank left
waiting in a tp or dp collective by a peer that failed would then sit there for half an hour
while a world collective gives up after the job's timeout (runtime/mesh.with_world_timeout).
"""

from __future__ import annotations

import pytest

from tests.dist.pool import PG_TIMEOUT_S

pytestmark = [pytest.mark.dist, pytest.mark.timeout(200)]


def _group_timeouts(rank: int, world_size: int) -> dict[str, list[float]]:
    import torch

    from autoplan.runtime.data_parallel import fsdp_mesh
    from autoplan.runtime.expert_parallel import build_expert_mesh
    from autoplan.runtime.mesh import ParallelDims, build_mesh

    def seconds(mesh) -> list[float]:
        return [g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                for g in mesh.get_all_groups()]

    dims = ParallelDims(dp=2, cp=2, zero_stage=3, ep=2)
    world = build_mesh(dims, "cpu")
    return {"world mesh": seconds(world), "dp x cp (flattened)": seconds(fsdp_mesh(world, dims)),
            "expert mesh": seconds(build_expert_mesh(dims, "cpu"))}


def test_mesh_groups_time_out_with_the_job(pool):
    for rank, found in enumerate(pool.run(_group_timeouts, 4)):
        for mesh, timeouts in found.items():
            assert timeouts and all(t == PG_TIMEOUT_S for t in timeouts), (rank, mesh, timeouts)
