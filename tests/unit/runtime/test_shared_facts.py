"""Facts the cost model and the runtime share, held against the runtime's built model: the
parameters each pipeline rank holds (padded vocabulary, stage placement, tied heads) for a
table of plans, and the FSDP units the cost model charges per chunk."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from autoplan.cost import params
from autoplan.model_spec import PRESETS
from autoplan.plan import Pipeline, Schedule

torch = pytest.importorskip("torch")

from autoplan.runtime.models.transformer import build_meta_model, vocab_rows  # noqa: E402
from autoplan.runtime.pipeline_parallel import (  # noqa: E402
    layers_per_stage,
    split_stage,
    stage_indices,
)

SPECS = {**PRESETS, "tiny-qwen2": PRESETS["tiny-llama"].replace(name="tiny-qwen2",
                                                                 qkv_bias=True),
         "tiny-qwen3": PRESETS["tiny-llama"].replace(name="tiny-qwen3", qk_norm=True)}
"""The presets, a Qwen2-style model (q, k and v biased, split by heads under tp; o none) and a
Qwen3-style one (q and k normalised per head: the norms whole on every rank, which the cost model
divides with the block, as the block norms)."""
CASES = [  # (model, vocab, tp, pp, vpp, schedule, split)
    ("tiny", 256, 1, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny", 1001, 2, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny", 256, 1, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-llama", 50257, 4, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-llama", 256, 1, 2, 2, Schedule.INTERLEAVED_1F1B, None),
    ("tiny-llama", 256, 1, 2, 1, Schedule.ONE_F_ONE_B, (1, 3)),
    ("tiny-mla", 256, 1, 1, 1, Schedule.ONE_F_ONE_B, None),  # multi-head latent attention
    ("tiny-mla", 1001, 2, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-qwen2", 256, 1, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-qwen2", 1001, 2, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-qwen3", 256, 1, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-qwen3", 1001, 2, 2, 1, Schedule.ONE_F_ONE_B, None),
]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("preset", "vocab", "tp", "pp", "vpp", "schedule", "split"), CASES)
def test_cost_model_params_per_rank_are_the_runtimes(preset, vocab, tp, pp, vpp, schedule,
                                                     split) -> None:
    spec = SPECS[preset].replace(vocab_size=vocab)
    assert vocab_rows(spec, tp) == int(params.padded_vocab(spec, tp))
    # the runtime's model at tp = 1 with the vocabulary padded for this tp: the cost model's
    # per-rank count times tp is the unsharded count (block matrices and the vocabulary split)
    meta = build_meta_model(spec, 0.0, tp)
    pipe = Pipeline(schedule=schedule, vpp=vpp,
                    layers_per_stage=split if split is None else tuple(split))
    stages = pp * vpp if pp > 1 else 1
    counts = layers_per_stage(spec.num_layers, stages, pipe.layers_per_stage)
    per_rank = []
    for rank in range(pp):
        idx = stage_indices(rank, pp, pipe) if pp > 1 else [0]
        per_rank.append(sum(_count(split_stage(meta, i, counts)) for i in idx))
    layers = [sum(counts[i] for i in (stage_indices(r, pp, pipe) if pp > 1 else [0]))
              for r in range(pp)]
    first, last = params.params_per_rank(spec, np.array(tp), np.array(pp), np.array(layers[0]),
                                         np.array(layers[-1]))
    # the cost model splits every block tensor over tp but MLA's down projections, and keeps
    # the position table and the final norm whole on each rank: times tp, it counts those
    # tp - 1 extra times (tests/dist/test_mla_parity checks the MLA shards on real ranks)
    pos = int(params.embedding_params(spec, 0))
    final_norm = params.norm_params(spec)
    whole = params.tp_replicated_params(spec)
    extra_first = pos + (final_norm if pp == 1 else 0) + layers[0] * whole
    assert float(first) * tp == pytest.approx(per_rank[0] + (tp - 1) * extra_first, abs=0.5)
    if pp > 1:
        extra_last = final_norm + layers[-1] * whole
        assert float(last) * tp == pytest.approx(per_rank[-1] + (tp - 1) * extra_last, abs=0.5)


def test_fsdp_units_are_blocks_plus_one_root_per_chunk() -> None:
    """The cost model's FSDP2 units per chunk (each block and the root: step_time's
    `layers_max + vpp` host work, `layers_max + 1` collectives per step) are the modules
    data_parallel.apply_fsdp wraps, counted on a one-rank gloo mesh."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from autoplan.plan import Offload, Precision
    from autoplan.runtime import data_parallel
    from autoplan.runtime.mesh import ParallelDims, build_mesh

    spec = PRESETS["tiny-llama"]
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dims = ParallelDims(zero_stage=3)
        model = build_meta_model(spec, 0.0, 1)
        data_parallel.apply_fsdp(model, build_mesh(dims, "cpu"), dims, Precision.BF16,
                                 Offload())
        units = sum(isinstance(m, FSDPModule) for m in model.modules())
    finally:
        if owned:
            dist.destroy_process_group()
    assert units == spec.num_layers + 1


def _collectives_of_one_step(dims, spec) -> dict[str, int]:
    """c10d collectives (by op name) of one forward and backward of the FSDP2-wrapped model on
    `dims`, in one process over torch's fake process group (it dispatches every collective as
    a real rank would and moves no data)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoplan.plan import Offload, Precision
    from autoplan.runtime import data_parallel
    from autoplan.runtime.mesh import build_mesh
    from autoplan.runtime.models.init import materialize_and_init

    calls: dict[str, int] = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                name = func.__name__.split(".")[0].strip("_")
                calls[name] = calls.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    try:
        model = build_meta_model(spec, 0.0, 1)
        data_parallel.apply_fsdp(model, build_mesh(dims, "cpu"), dims, Precision.FP32,
                                 Offload())
        materialize_and_init(model, torch.device("cpu"), spec.num_layers, 0,
                             spec.tie_embeddings)
        tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
        with Count():
            model(tokens).float().sum().backward()
    finally:
        dist.destroy_process_group()
    return calls


@pytest.mark.parametrize("dp_shard", [None, 2])
def test_hsdp_collectives_are_the_cost_models(dp_shard) -> None:
    """ZeRO-2 on dp 4, fully sharded or HSDP 2 x 2: per FSDP unit (each block and the root,
    dp_comm._dp_comm's `calls` = layers + 1) one all-gather and one reduce-scatter inside
    the shard group, and under HSDP one all-reduce across the replicas (the replica term of
    _dp_comm, priced when Rows.replicate > 1) -- none without HSDP."""
    from autoplan.cost.rows import rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan
    from autoplan.plan_table import plan_to_row
    from autoplan.runtime.mesh import ParallelDims

    spec = PRESETS["tiny-llama"]
    plan = Plan(model="tiny-llama", cluster=ClusterRef("cpu-gloo", 4), batch=Batch(1, 4),
                parallel=Parallel(dp=4, dp_shard=dp_shard), zero_stage=2)
    # in a spawned process: FSDP over a fake process group's mesh leaves state in this one
    # (its named subgroups, most likely) that the dist tests' ranks, forked from it, inherit
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        calls = ex.submit(_collectives_of_one_step, ParallelDims.from_plan(plan), spec).result(
            timeout=300)
    r = rows_of(plan_to_row(plan, spec), spec, "fp32", load_runtime("autoplan-cpu"))
    units = int(r.layers_max[0]) + 1
    assert calls.get("allgather_base", 0) == units
    assert calls.get("reduce_scatter_base", 0) == units
    assert float(r.shard[0]) == (dp_shard or 4)
    assert calls.get("allreduce", 0) == (units if float(r.replicate[0]) > 1 else 0)



RECOMPUTE_CASES = [  # (layers_per_stage, recompute.num_layers) at pp 2, vpp 2
    ((2, 2, 2, 2), 1),
    ((2, 2, 2, 2), 2),
    ((1, 3, 3, 1), 1),  # uneven: every stage has at least one block to recompute
    ((3, 2, 1, 2), 1),
    ((1, 3, 3, 1), 2),  # refused: the runtime would recompute 1 + 2 blocks, priced as 4
]


@pytest.mark.parametrize(("split", "k"), RECOMPUTE_CASES)
def test_blocks_recomputed_per_rank_are_the_runtimes(split, k) -> None:
    """recompute.num_layers counts per model chunk: what runtime/recompute.apply_recompute
    wraps on each rank's chunks is what the cost model prices (rows.recomputed_layers) for
    every plan the rules let through, and the rules refuse the rest."""
    from autoplan.cost.rows import recomputed_layers, rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.hardware import cluster
    from autoplan.plan import plan_from_dict
    from autoplan.plan_rules import validate_plan
    from autoplan.plan_table import plan_to_row
    from autoplan.runtime.recompute import RecomputePolicy, apply_recompute

    pp, vpp = 2, 2
    spec = PRESETS["tiny-llama"].replace(num_layers=sum(split))
    pipe = Pipeline(schedule=Schedule.INTERLEAVED_1F1B, vpp=vpp, layers_per_stage=split)
    meta = build_meta_model(spec, 0.0, 1)
    counts = layers_per_stage(spec.num_layers, pp * vpp, split)
    run = [sum(apply_recompute(split_stage(meta, i, counts), RecomputePolicy.FULL, k)
               for i in stage_indices(rank, pp, pipe)) for rank in range(pp)]
    plan = plan_from_dict({
        "model": "tiny-llama", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": pp},
        "parallel": {"pp": pp}, "batch": {"micro_batch_size": 1, "global_batch_size": 4},
        "pipeline": {"schedule": "interleaved-1f1b", "vpp": vpp, "layers_per_stage": list(split)},
        "recompute": {"policy": "full", "num_layers": k}})
    refused = [p for p in validate_plan(plan, spec, cluster("h100-sxm-80gb", pp))
               if "recompute.num_layers" in p]
    row = plan_to_row(plan, spec)
    r = rows_of(row, spec, "bf16", load_runtime("autoplan-cuda"))
    priced = [float(recomputed_layers(row[c], r)[0]) for c in ("layers_first", "layers_last")]
    if min(split) >= k:
        assert not refused and priced == [float(n) for n in run]
    else:
        assert refused and "smallest pipeline stage (1" in refused[0]
        assert priced != [float(n) for n in run]  # what the rule is there for
