"""A model with q, k and v biases alone (model.qkv_bias, Qwen2) as the runtime builds it: biased
q, k and v Linears and no other bias, the cost model's count, the checkpoint shapes that name
them, and a resume across the field refused (the saved tensors do not fit)."""

from __future__ import annotations

import pytest

from autoplan.cost import params
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Plan
from autoplan.runtime.checkpoint_compat import check_resumable, expected_shapes, model_changes
from autoplan.runtime.models.init import full_init_value
from autoplan.runtime.models.transformer import build_meta_model
from tests.unit.fake_checkpoint import saved_as

LLAMA = PRESETS["tiny-llama"]  # 4 layers, h 64, 4 heads of 16, 2 kv heads, swiglu 176
QWEN = LLAMA.replace(name="tiny-qwen2", qkv_bias=True)


def _biases(model) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters() if n.endswith(".bias")}


def test_q_k_v_alone_carry_biases_of_their_output_widths() -> None:
    biases = _biases(build_meta_model(QWEN))
    want = {}
    for i in range(QWEN.num_layers):
        want |= {f"layers.{i}.attention.wq.bias": (4 * 16,),
                 f"layers.{i}.attention.wk.bias": (2 * 16,),
                 f"layers.{i}.attention.wv.bias": (2 * 16,)}
    assert biases == want
    assert _biases(build_meta_model(LLAMA)) == {}


@pytest.mark.parametrize("tp", [1, 2])
def test_the_runtime_model_has_the_cost_models_parameters(tp) -> None:
    """Whole model (vocabulary padded for tp): total_params plus the padding rows."""
    model = build_meta_model(QWEN, tp=tp)
    count = sum(p.numel() for p in model.parameters())
    padding = 2 * (int(params.padded_vocab(QWEN, tp)) - QWEN.vocab_size) * QWEN.hidden_size
    assert count == params.total_params(QWEN) + padding
    assert count - sum(p.numel() for p in build_meta_model(LLAMA, tp=tp).parameters()) == \
        QWEN.num_layers * (64 + 2 * 32)


def test_checkpoint_shapes_name_the_biases_and_they_start_at_zero() -> None:
    shapes = expected_shapes(QWEN, 2)
    assert shapes["layers.3.attention.wk.bias"] == (32,)
    assert "layers.3.attention.wo.bias" not in shapes
    assert not full_init_value("layers.0.attention.wq.bias", (64,), 4, 0).any()


def test_a_checkpoint_saved_without_the_biases_does_not_resume_with_them(tmp_path) -> None:
    """model_changes names the field (a checkpoint saved before it has no qkv_bias in meta.json
    and reads as false); the shapes say which tensors are missing."""
    found = saved_as(LLAMA, tmp_path)
    assert "qkv_bias" not in found.meta["model"]  # left out at its default, as before the field
    assert model_changes(found.meta, LLAMA) == []
    assert model_changes(found.meta, QWEN) == ["model.qkv_bias False -> True"]
    plan = Plan(model=QWEN, cluster=ClusterRef("cpu-gloo", 1), batch=Batch(1, 1))
    with pytest.raises(ConfigError) as err:
        check_resumable(found, plan, QWEN)
    assert "model.qkv_bias False -> True" in str(err.value)
    assert "layers.0.attention.wk.bias is missing from the checkpoint" in str(err.value)
