"""Single-process unit tests of the runtime's pure pieces (no process group)."""

from __future__ import annotations

import pydoc_data.topics

import pytest
import torch

from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS
from autoplan.plan import Pipeline, Schedule
from autoplan.runtime.data import ByteText, SyntheticTokens, local_batch, make_source
from autoplan.runtime.models.init import materialize_and_init
from autoplan.runtime.models.transformer import build_meta_model
from autoplan.runtime.names import clean_fqn
from autoplan.runtime.pipeline_parallel import layers_per_stage, split_stage, stage_indices
from autoplan.runtime.validation import check_plan, runtime_problems
from tests.dist.parity import make_plan


def test_layers_per_stage_even_and_given():
    assert layers_per_stage(8, 4, None) == [2, 2, 2, 2]
    assert layers_per_stage(5, 2, None) == [3, 2]
    assert layers_per_stage(4, 2, (1, 3)) == [1, 3]


def test_stage_placement_looped_and_v():
    assert stage_indices(1, 4, Pipeline(Schedule.INTERLEAVED_1F1B, vpp=2)) == [1, 5]
    assert stage_indices(1, 4, Pipeline(Schedule.ZERO_BUBBLE, vpp=2)) == [1, 6]
    assert stage_indices(3, 4, Pipeline(Schedule.ONE_F_ONE_B)) == [3]


def test_split_stage_keeps_global_fqns():
    meta = build_meta_model(PRESETS["tiny"])
    first, last = split_stage(meta, 0, [3, 1]), split_stage(meta, 1, [3, 1])
    assert list(first.layers.keys()) == ["0", "1", "2"] and first.output is None
    assert list(last.layers.keys()) == ["3"] and last.embed is None
    assert "layers.3.attention.wq.weight" in dict(last.named_parameters())


def test_init_is_deterministic_and_split_independent():
    spec = PRESETS["tiny-llama"]
    full = build_meta_model(spec)
    materialize_and_init(full, torch.device("cpu"), spec.num_layers, seed=3)
    part = split_stage(build_meta_model(spec), 1, [2, 2])
    materialize_and_init(part, torch.device("cpu"), spec.num_layers, seed=3)
    a, b = full.state_dict(), part.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_model_forward_shapes_gpt_and_llama():
    for name in ("tiny", "tiny-llama"):
        spec = PRESETS[name]
        model = build_meta_model(spec)
        materialize_and_init(model, torch.device("cpu"), spec.num_layers, seed=0)
        tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
        assert model(tokens).shape == (2, spec.seq_len, spec.vocab_size)


def test_clean_fqn_strips_wrappers():
    assert clean_fqn("module.layers.0._checkpoint_wrapped_module.attention.wq.weight") == (
        "layers.0.attention.wq.weight"
    )


def test_batches_are_deterministic_and_split_over_dp():
    src = SyntheticTokens(256, 16, seed=1)
    x, y = local_batch(src, 3, 8, 1, 0)
    x0, _ = local_batch(src, 3, 8, 2, 0)
    x1, _ = local_batch(src, 3, 8, 2, 1)
    assert torch.equal(torch.cat([x0, x1]), x)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_byte_text_reads_pydoc_topics(tmp_path):
    path = tmp_path / "topics.txt"
    path.write_text("\n".join(pydoc_data.topics.topics.values()), encoding="utf-8")
    src = ByteText(path, 64, seed=0)
    assert src.num_windows > 1000
    sample = src.sample(5)
    assert sample.shape == (65,) and int(sample.max()) < 256
    assert torch.equal(sample, ByteText(path, 64, seed=0).sample(5))
    with pytest.raises(ConfigError):
        make_source(str(tmp_path / "missing"), 256, 64, 0)


@pytest.mark.parametrize(
    ("plan_kw", "fragment"),
    [
        (dict(tp=8), "does not divide num_heads"),
        (dict(dp=2, mbs=3, gbs=8), "not a multiple of micro_batch_size"),
        (dict(pp=4, mbs=4, gbs=8), "micro-batches per step (2) >= pp=4"),
        (dict(pp=2, schedule="zero-bubble", recompute="selective"), "selective"),
        (dict(dp=2, offload=True), "offload needs zero_stage"),
        (dict(cp=3), "model.seq_len=64 is not divisible by 2*cp=6"),
        (dict(cp=32, tp=4, sp=True), "seq_len/cp = 64/32 = 2; lower tp or cp"),
    ],
)
def test_runtime_problems_name_the_values(plan_kw, fragment):
    plan = make_plan(**plan_kw)
    assert any(fragment in p for p in runtime_problems(plan, plan.model_spec()))


def test_world_size_mismatch_is_a_config_error():
    plan = make_plan(dp=2)
    with pytest.raises(ConfigError, match="world size 4"):
        check_plan(plan, plan.model_spec(), world_size=4)


def test_zero_mapping_onto_ddp_and_fsdp():
    from autoplan.plan import Offload, Precision
    from autoplan.runtime.data_parallel import reshard_after_forward, uses_ddp, uses_fsdp
    from autoplan.runtime.mesh import ParallelDims

    fp32, off = Precision.FP32, Offload()
    assert uses_ddp(ParallelDims(dp=2), fp32, off)
    assert not uses_ddp(ParallelDims(dp=2, tp=2), fp32, off)  # ZeRO-0 + TP: HSDP replicate
    assert uses_fsdp(ParallelDims(dp=2, tp=2), fp32, off)
    assert uses_fsdp(ParallelDims(dp=2, zero_stage=1), fp32, off)
    assert uses_fsdp(ParallelDims(), Precision.BF16, off)  # mixed precision via FSDP2
    assert not uses_fsdp(ParallelDims(tp=2), fp32, off)  # nothing to reduce over dp
    assert ParallelDims(dp=4, zero_stage=0).mesh_shape == (1, 4, 1, 1, 1)
    assert ParallelDims(dp=4, zero_stage=1).mesh_shape == (1, 1, 4, 1, 1)
    assert [reshard_after_forward(z) for z in range(4)] == [False, False, False, True]


def test_context_parallel_plans_are_accepted():
    for kw in (dict(cp=2), dict(cp=4, model="tiny-llama"), dict(cp=2, tp=2, sp=True, zero=1),
               dict(cp=2, pp=2, dp=2, zero=3)):
        plan = make_plan(**kw)
        assert runtime_problems(plan, plan.model_spec()) == [], kw


def test_context_parallel_reduces_gradients_over_cp_with_fsdp():
    from autoplan.plan import Offload, Precision
    from autoplan.runtime.data_parallel import uses_ddp, uses_fsdp
    from autoplan.runtime.mesh import ParallelDims

    fp32, off = Precision.FP32, Offload()
    assert uses_fsdp(ParallelDims(cp=2), fp32, off)  # dp = 1: the cp ranks still average
    assert not uses_ddp(ParallelDims(dp=2, cp=2), fp32, off)
