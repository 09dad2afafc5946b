"""Exports of the practitioners' splits: embedding-only / loss-only stages for Megatron-Core and
torchtitan, DeepSpeed's own type:transformer partition for Megatron-DeepSpeed (issue #12)."""

from __future__ import annotations

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.megatron import layout_string
from autoplan.export.registry import get_target
from autoplan.export.torchtitan import module_parts
from autoplan.model_spec import ModelSpec
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan

from .cases import plan

BLOOM_LIKE = ModelSpec(name="bloom-like", num_layers=70, hidden_size=1024, num_heads=16,
                       vocab_size=250880, seq_len=2048, tie_embeddings=True)


def test_megatron_layout_writes_empty_end_stages_as_e_and_l() -> None:
    assert layout_string((0, 4, 4, 0)) == "E|t*4|t*4|L"
    assert layout_string((0, 8)) == "E|t*8L"
    p = plan("llama-3-8b", 32, parallel=Parallel(dp=8, pp=4),
             pipeline=Pipeline(layers_per_stage=(0, 16, 16, 0)), batch=Batch(1, 64))
    files = export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions())
    text = "\n".join(files.values())
    assert "--pipeline-model-parallel-layout 'E|t*16|t*16|L'" in text  # quoted: '|'


def test_torchtitan_stages_of_only_the_embedding_or_the_head() -> None:
    assert module_parts((0, 2, 0), "python") == [
        ["tok_embeddings"], ["layers.0", "layers.1"], ["norm", "lm_head"]]


def _ds_plan(split: tuple[int, ...]) -> Plan:
    return Plan(model=BLOOM_LIKE, cluster=ClusterRef("a100-sxm4-80gb", 96),
                parallel=Parallel(dp=8, pp=12), batch=Batch(1, 96),
                pipeline=Pipeline(layers_per_stage=split), zero_stage=1)


def test_megatron_deepspeed_takes_deepspeeds_own_partition() -> None:
    ok = _ds_plan((6,) * 10 + (5, 5))
    files = export_plan(get_target("deepspeed"), ok, BLOOM_LIKE, ExportOptions())
    assert any("--pipeline-model-parallel-size 12" in t for t in files.values())


@pytest.mark.parametrize("split", [(5,) + (6,) * 10 + (5,), (0,) + (7,) * 10 + (0,)])
def test_megatron_deepspeed_refuses_other_splits_naming_its_own(split) -> None:
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("deepspeed"), _ds_plan(split), BLOOM_LIKE, ExportOptions())
    message = str(err.value)
    assert "\n" not in message.strip()
    assert f"gives {[6] * 10 + [5, 5]}" in message
