"""The runtime's rotary embedding follows the model's rope_theta (models/layers.py)."""

from __future__ import annotations

import pytest

from autoplan.model_spec import PRESETS

torch = pytest.importorskip("torch")

from autoplan.runtime.models.layers import Attention, rope_cos_sin, rope_inv_freq  # noqa: E402

CPU = torch.device("cpu")


def test_inverse_frequencies_follow_theta() -> None:
    """theta^(-2i/d): pair 0 turns by one radian per position at any base; the slowest pair
    turns theta^((d-2)/d) times slower, so Llama 3's 500000 is 50x slower there than 10000."""
    low, high = rope_inv_freq(8, 10000.0, CPU), rope_inv_freq(8, 500000.0, CPU)
    assert low[0] == high[0] == 1.0
    torch.testing.assert_close(low, torch.tensor([10000.0 ** (-i / 8) for i in (0, 2, 4, 6)]))
    torch.testing.assert_close(high, torch.tensor([500000.0 ** (-i / 8) for i in (0, 2, 4, 6)]))
    assert (high[1:] < low[1:]).all()
    cos, _ = rope_cos_sin(4, 8, CPU, 500000.0)
    torch.testing.assert_close(cos[3], torch.cos(3 * high))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_attention_rotates_by_the_spec_theta(name: str) -> None:
    """The same weights give other outputs at another base (tiny presets keep 10000, so the
    parity fixtures do not move)."""
    spec = PRESETS[name]
    assert spec.rope_theta == 10000.0
    if spec.mla is not None:
        from autoplan.runtime.models.mla import MultiHeadLatentAttention as Layer
    else:
        Layer = Attention
    torch.manual_seed(0)
    base = Layer(spec)
    other = Layer(spec.replace(rope_theta=500000.0))
    other.load_state_dict(base.state_dict())
    assert other.rope_theta == 500000.0
    x = torch.randn(1, 16, spec.hidden_size)
    with torch.no_grad():
        assert not torch.allclose(base(x), other(x))
