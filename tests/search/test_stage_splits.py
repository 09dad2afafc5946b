"""Embedding-only / loss-only stages and DeepSpeed's own partition as searched layer splits.

`embed-loss` lists [0, blocks..., 0] where a runtime runs it; `deepspeed` is the split
Megatron-DeepSpeed's PipelineModule makes (partition_method type:transformer), checked against
the installed DeepSpeed's partition_balanced, and the only uneven split the deepspeed runtime
keeps, so its winner exports.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost.runtime_rules import lacking
from autoplan.cost.runtimes import load_runtime
from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec, load_model
from autoplan.plan import Pipeline
from autoplan.search.partition import (
    GPT_MODEL_PIPE_SPECS,
    deepspeed_layers,
    embed_loss_layers,
    heaviest_rank_flops,
    layer_graph,
    stage_layers,
)
from autoplan.search.space import pipeline_shapes
from autoplan.search_space import Split, load_space


@pytest.mark.parametrize(("layers", "stages"),
                         [(70, 12), (70, 6), (96, 8), (126, 16), (30, 7), (61, 16), (9, 2)])
def test_deepspeed_split_is_deepspeeds_own_partition(layers: int, stages: int) -> None:
    utils = pytest.importorskip("deepspeed.runtime.utils")
    before, after = GPT_MODEL_PIPE_SPECS
    weights = [0] * before + [1] * layers + [0] * after
    cuts = utils.partition_balanced(weights, stages)
    theirs = tuple(int(sum(weights[cuts[s]:cuts[s + 1]])) for s in range(stages))
    assert deepspeed_layers(layers, stages) == theirs


def test_bloom_partition_and_embed_loss_layout() -> None:
    # BLOOM's 70 layers on 12 stages: the last two stages one block lighter
    assert deepspeed_layers(70, 12) == (6,) * 10 + (5, 5)
    assert embed_loss_layers(126, 128) == (0, *(1,) * 126, 0)
    assert embed_loss_layers(10, 4) == (0, 5, 5, 0)
    assert embed_loss_layers(10, 2) is None


def test_heaviest_rank_counts_the_head_on_a_loss_only_stage() -> None:
    """The output layer of a loss-only last stage is that rank's load, not the load of the
    block before it (a large vocabulary: the head outweighs two blocks)."""
    model = _model(4)
    g = layer_graph(model)
    head, block = g.nodes["head"]["flops"], g.nodes["block_0"]["flops"]
    assert head > 2 * block
    assert heaviest_rank_flops(model, (2, 2, 0), 3, 1) == pytest.approx(head)
    assert heaviest_rank_flops(model, (0, 2, 2, 0), 4, 1) == pytest.approx(head)


def _model(layers: int) -> ModelSpec:
    return ModelSpec(name=f"m{layers}", num_layers=layers, hidden_size=1024, num_heads=8,
                     vocab_size=250880, seq_len=2048)


def test_default_space_lists_deepspeeds_split_and_the_runtime_keeps_only_it() -> None:
    space = load_space("default")
    model = _model(70)
    rows = pipeline_shapes(space, model, 12)
    rows = rows[rows[:, 0] == 1]  # 1f1b, the one schedule DeepSpeed's pipeline engine runs
    ds = rows[:, 2] == list(Split).index(Split.DEEPSPEED)
    assert ds.sum() == 1 and tuple(rows[ds][0, 3:6]) == (6, 6, 5)  # first, max, last rank
    n = len(rows)
    table = {k: rows[:, i] for i, k in enumerate(
        ("schedule", "vpp", "split", "layers_first", "layers_max", "layers_last"))}
    table.update(pp=np.full(n, 12), tp=np.ones(n, int), zero_stage=np.zeros(n, int),
                 recompute=np.zeros(n, int),
                 recompute_layers=np.full(n, -1), offload_optimizer=np.zeros(n, bool),
                 offload_params=np.zeros(n, bool))
    uneven = rows[:, 2] != 0  # the even row is listed too (the rules refuse 70 on 12)
    assert (uneven & ~ds).sum() >= 1  # balanced, ends
    assert (lacking(table, load_runtime("deepspeed"), model) == (uneven & ~ds)).all()
    assert (lacking(table, load_runtime("megatron"), model) == ds).all()


def test_embed_loss_listed_where_it_lightens_the_heaviest_rank() -> None:
    """126 layers on pp 16 x vpp 8 = 128 stages: one block per stage between an embedding and
    a loss stage; no even split exists, and every rank's load stays at 8 blocks at most."""
    space = load_space("default")
    model = load_model("llama-3.1-405b")
    rows = pipeline_shapes(space, model, 16)
    code = list(Split).index(Split.EMBED_LOSS)
    listed = rows[(rows[:, 2] == code) & (rows[:, 1] == 8)]
    assert len(listed) >= 1
    assert stage_layers(model, 16, 8, "embed-loss") == (0, *(1,) * 126, 0)


def test_plan_refuses_an_empty_middle_stage() -> None:
    with pytest.raises(ConfigError, match=r"layers_per_stage\[1\].*first and the last"):
        Pipeline(layers_per_stage=(2, 0, 2))
    assert Pipeline(layers_per_stage=(0, 4, 0)).layers_per_stage == (0, 4, 0)


def test_runtime_layer_splits_are_checked() -> None:
    from autoplan.cost.runtimes import runtime_from_dict

    with pytest.raises(ConfigError, match="runtime.layer_splits"):
        runtime_from_dict({"schema_version": 1, "name": "x", "layer_splits": ["balanced"]})


def test_deepspeed_runtime_refuses_zero2_under_its_pipeline() -> None:
    """DeepSpeed's PipelineEngine asserts ZeRO < 2, so --runtime deepspeed keeps pp > 1 plans
    at ZeRO 0/1 and the export (which refuses ZeRO-2 with a pipeline) takes its winner."""
    from autoplan.cost.runtime_rules import refusals
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan

    plan = Plan(model="gpt3-1.3b", cluster=ClusterRef("a100-sxm4-80gb", 8),
                batch=Batch(1, 64), parallel=Parallel(dp=4, pp=2), zero_stage=2)
    assert any("ZeRO stage 2 with a pipeline" in r
               for r in refusals(plan, load_runtime("deepspeed")))
    assert refusals(plan.replace(zero_stage=1), load_runtime("deepspeed")) == []


def test_a_space_without_the_even_split_still_pipelines() -> None:
    """Where the space lists only uneven splits, a split no lighter than the even one is the
    only way to run that pipeline, so it is listed (it was dropped as never shortening a step
    the even split would run, leaving the pipeline no shape at all)."""
    import dataclasses

    from autoplan.model_spec import PRESETS

    model = PRESETS["gpt3-13b"]  # 40 layers: DeepSpeed's split of them is the even one
    base = load_space("default")
    space = dataclasses.replace(base, pipeline=dataclasses.replace(
        base.pipeline, split=(Split.DEEPSPEED,), vpp=(1,)))
    for pp in (2, 4, 8):
        shapes = pipeline_shapes(space, model, pp)
        assert len(shapes) > 0
        assert set(shapes[:, 2]) == {list(Split).index(Split.DEEPSPEED)}
