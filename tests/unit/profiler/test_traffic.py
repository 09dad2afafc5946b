"""The eager element-wise traffic the cost model charges is what the runtime's block moves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost import elementwise
from autoplan.model_spec import PRESETS, NormKind
from autoplan.profiler.traffic import block_traffic_bytes, traffic_coefficients


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_counted_coefficients_are_the_cost_models(preset) -> None:
    base = PRESETS[preset]
    counted = traffic_coefficients(base)
    assert counted == pytest.approx(elementwise.EAGER_BYTES_PER_TOKEN[base.norm], abs=0.1)


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_formula_predicts_a_shape_it_was_not_solved_from(preset) -> None:
    spec = replace(PRESETS[preset], num_heads=16, num_kv_heads=8, hidden_size=256,
                   ffn_hidden_size=512, head_dim=16)
    fwd, bwd = block_traffic_bytes(spec, 2, 16)
    predicted = float(elementwise.eager_elementwise_bytes(spec, 32, 1, False, False, "bf16"))
    assert predicted == pytest.approx(fwd + bwd, rel=0.05)


def test_qk_norms_move_a_norms_bytes_per_element_of_q_and_k() -> None:
    """Qwen3's per-head norms of q and k, counted on the runtime's block (not solved from it):
    the composite RMSNorm's bytes per element over the q and k widths."""
    spec = replace(PRESETS["tiny-llama"], num_heads=16, num_kv_heads=8, hidden_size=256,
                   ffn_hidden_size=512, head_dim=16, qk_norm=True)
    fwd, bwd = block_traffic_bytes(spec, 2, 16)
    predicted = float(elementwise.eager_elementwise_bytes(spec, 32, 1, False, False, "bf16"))
    assert predicted == pytest.approx(fwd + bwd, rel=0.02)


def test_a_fused_norm_moves_less_than_the_composite_one() -> None:
    spec = PRESETS["llama-3-8b"]
    assert spec.norm is NormKind.RMSNORM
    composite = float(elementwise.eager_elementwise_bytes(spec, 1, 1, False, False, "bf16"))
    fused = float(elementwise.eager_elementwise_bytes(spec, 1, 1, False, True, "bf16"))
    saved = (2 * (elementwise.COMPOSITE_RMSNORM_BYTES - elementwise.FUSED_NORM_BYTES)
             * spec.hidden_size)
    assert composite - fused == pytest.approx(saved)
