"""The expert mesh lays ranks out as Megatron-Core's MoE parallel folding (etp innermost, then ep,
then expert-DP; with etp = tp the etp groups are the tp groups), and apply_ep shards each
expert's FFN dimension over etp (w1/w3 column-wise, w2 row-wise, w2's bias whole). One process
over torch's fake process group (collectives dispatched, no data moved)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.model_spec import MlpKind, load_model
from autoplan.runtime.mesh import ParallelDims

torch = pytest.importorskip("torch")


@pytest.fixture
def fake_world():
    """A fake process group of `world` ranks, this process rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(world: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def _groups(mesh, name: str) -> set[tuple[int, ...]]:
    """The rank groups along mesh dimension `name` (every group, not only this rank's)."""
    grid = mesh.mesh.movedim(mesh.mesh_dim_names.index(name), -1)
    return {tuple(int(r) for r in row) for row in grid.reshape(-1, grid.shape[-1])}


def test_etp_groups_are_the_tp_groups_and_ep_strides_over_them(fake_world):
    from autoplan.runtime.expert_parallel import build_expert_mesh
    from autoplan.runtime.mesh import build_mesh

    dims = ParallelDims(pp=2, dp=2, tp=2, ep=2, etp=2, zero_stage=1)
    fake_world(dims.world_size)
    world, experts = build_mesh(dims, "cpu"), build_expert_mesh(dims, "cpu")
    assert _groups(experts, "etp") == _groups(world, "tp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    # Megatron-Core's expert rank order "tp-ep-dp-pp": ep groups stride over the etp ranks
    assert _groups(experts, "ep") == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert experts["edp_shard"].size() == dims.edp == 1


def test_etp_over_dp_ranks_leaves_an_expert_dp_group(fake_world):
    from autoplan.runtime.expert_parallel import build_expert_mesh

    dims = ParallelDims(dp=8, ep=2, etp=2, zero_stage=3)
    fake_world(dims.world_size)
    mesh = build_expert_mesh(dims, "cpu")
    assert _groups(mesh, "etp") == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert _groups(mesh, "edp_shard") == {(0, 4), (1, 5), (2, 6), (3, 7)}


@pytest.mark.parametrize("mlp", [MlpKind.SWIGLU, MlpKind.GELU])
def test_apply_ep_splits_each_experts_ffn_over_etp(fake_world, mlp):
    from torch.distributed.tensor import Replicate, Shard

    from autoplan.runtime.expert_parallel import PartialBias, apply_ep, build_expert_mesh
    from autoplan.runtime.models.moe import Experts
    from autoplan.runtime.models.transformer import build_meta_model

    spec = load_model("tiny-moe").replace(mlp=mlp, bias=True)
    moe = spec.moe
    dims = ParallelDims(dp=4, ep=2, etp=2)
    fake_world(dims.world_size)
    model = build_meta_model(spec, 0.0, 1)
    apply_ep(model, build_expert_mesh(dims, "cpu"))
    e, h, f = moe.num_experts, spec.hidden_size, moe.expert_ffn_hidden_size
    ex = next(m for m in model.modules() if isinstance(m, Experts))
    names = ("w1", "w3") if mlp == MlpKind.SWIGLU else ("w1",)
    for name in names:
        w, b = getattr(ex, name).weight, getattr(ex, name).bias
        assert w.shape == (e, f, h) and w.to_local().shape == (e // 2, f // 2, h)
        assert tuple(w.placements) == (Shard(0), Shard(1))
        assert b.to_local().shape == (e // 2, f // 2)
    assert ex.w2.weight.to_local().shape == (e // 2, h, f // 2)
    assert tuple(ex.w2.weight.placements) == (Shard(0), Shard(2))
    assert tuple(ex.w2.bias.placements) == (Shard(0), Replicate())
    assert isinstance(ex.partial_bias, PartialBias) and ex.partial_bias.first


def test_without_etp_the_experts_stay_whole_on_the_ep_mesh(fake_world):
    from torch.distributed.tensor import Shard

    from autoplan.runtime.expert_parallel import apply_ep, build_expert_mesh
    from autoplan.runtime.models.moe import Experts
    from autoplan.runtime.models.transformer import build_meta_model

    spec = load_model("tiny-moe")
    spec = spec.replace(moe=dataclasses.replace(spec.moe, first_dense_layers=0))
    dims = ParallelDims(dp=2, ep=2)
    fake_world(dims.world_size)
    model = build_meta_model(spec, 0.0, 1)
    apply_ep(model, build_expert_mesh(dims, "cpu"))
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    assert len(experts) == spec.num_layers
    for m in experts:
        assert m.partial_bias is None
        assert tuple(m.w1.weight.placements) == (Shard(0),)
        assert m.w1.weight.to_local().shape[1:] == m.w1.weight.shape[1:]
