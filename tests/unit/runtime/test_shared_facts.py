"""Facts the cost model and the runtime share, held against the runtime's built model: the
parameters each pipeline rank holds (padded vocabulary, stage placement, tied heads) for a
table of plans, and the FSDP units the cost model charges per chunk."""

from __future__ import annotations

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

CASES = [  # (preset, vocab, tp, pp, vpp, schedule, split)
    ("tiny", 256, 1, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny", 1001, 2, 1, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny", 256, 1, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-llama", 50257, 4, 2, 1, Schedule.ONE_F_ONE_B, None),
    ("tiny-llama", 256, 1, 2, 2, Schedule.INTERLEAVED_1F1B, None),
    ("tiny-llama", 256, 1, 2, 1, Schedule.ONE_F_ONE_B, (1, 3)),
]


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("preset", "vocab", "tp", "pp", "vpp", "schedule", "split"), CASES)
def test_cost_model_params_per_rank_are_the_runtimes(preset, vocab, tp, pp, vpp, schedule,
                                                     split) -> None:
    spec = PRESETS[preset].replace(vocab_size=vocab)
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
    # the cost model splits every block tensor over tp and keeps the position table and the
    # final norm whole on each rank: times tp, it counts those tp - 1 extra times
    pos = int(params.embedding_params(spec, 0))
    final_norm = params.norm_params(spec)
    extra_first = pos + (final_norm if pp == 1 else 0)
    assert float(first) * tp == pytest.approx(per_rank[0] + (tp - 1) * extra_first, abs=0.5)
    if pp > 1:
        assert float(last) * tp == pytest.approx(per_rank[-1] + (tp - 1) * final_norm, abs=0.5)


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
