"""The dtype on the wire of every data-parallel gradient reduction, on the replicated path
(ZeRO-0: FSDP2 on the (dp, 1) mesh, all-reduce) and under HSDP (reduce-scatter in the shard
group, all-reduce across replicas): bf16 where grad_reduce_dtype asks, else fp32. One process
over torch's fake process group (every collective dispatched as a rank would, no data moved)."""

from __future__ import annotations

import pytest

from autoplan.model_spec import PRESETS
from autoplan.plan import Offload, Precision, ReduceDtype

torch = pytest.importorskip("torch")


def _wire_dtypes(dims, reduce: ReduceDtype | None) -> dict[str, set[str]]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoplan.runtime import data_parallel
    from autoplan.runtime.mesh import build_mesh
    from autoplan.runtime.models.init import materialize_and_init
    from autoplan.runtime.models.transformer import build_meta_model

    seen: dict[str, set[str]] = {}

    class Wire(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0].strip("_")
            if func.namespace == "c10d" and ("reduce" in name):
                for a in args:
                    for t in a if isinstance(a, (list, tuple)) else [a]:
                        if isinstance(t, torch.Tensor) and t.numel() > 1:
                            seen.setdefault(name, set()).add(str(t.dtype))
            return func(*args, **(kwargs or {}))

    spec = PRESETS["tiny"]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    try:
        model = build_meta_model(spec, 0.0, 1)
        data_parallel.apply_fsdp(model, build_mesh(dims, "cpu"), dims, Precision.BF16,
                                 Offload(), reduce)
        materialize_and_init(model, torch.device("cpu"), spec.num_layers, 0,
                             spec.tie_embeddings)
        with Wire():
            model(torch.randint(0, spec.vocab_size, (2, spec.seq_len))).float().sum().backward()
    finally:
        dist.destroy_process_group()
    return seen


@pytest.mark.parametrize(("zero", "hsdp_shard", "ops"), [
    (0, None, {"allreduce"}),  # replicated: one all-reduce per unit
    (2, 2, {"reduce_scatter_base", "allreduce"}),  # HSDP 2 x 2
])
@pytest.mark.parametrize(("reduce", "dtype"), [(None, "torch.float32"),
                                               (ReduceDtype.BF16, "torch.bfloat16")])
def test_gradients_go_on_the_wire_in_the_plans_reduce_dtype(zero, hsdp_shard, ops, reduce,
                                                           dtype):
    from autoplan.runtime.mesh import ParallelDims

    dims = ParallelDims(dp=2 if hsdp_shard is None else 4, zero_stage=zero,
                        hsdp_shard=hsdp_shard)
    seen = _wire_dtypes(dims, reduce)
    assert set(seen) == ops
    assert all(v == {dtype} for v in seen.values()), seen
