"""Bytes the element-wise kernels move, against the counts they are read off."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import elementwise
from autoplan.model_spec import PRESETS


def test_fused_elementwise_bytes_count_korthikanti_s_kernels() -> None:
    """GPT block with dropout, bf16, forward: 2 LayerNorms (4sbh each) and 2 bias-dropout-adds
    (7sbh each) h-wide, bias-GeLU 16sbh split by tp (Korthikanti et al. 2022 §4.1); backward
    twice the forward. Without sequence parallelism the h-wide kernels run whole on every
    tensor-parallel rank."""
    import dataclasses

    from autoplan.cost import activations
    from autoplan.cost.elementwise import fused_elementwise_bytes

    model = dataclasses.replace(PRESETS["gpt3-13b"], dropout=0.1)
    b, one = np.ones(1), np.ones(1)
    sbh = model.seq_len * model.hidden_size
    for tp, sp, forward_sbh in ((1, False, 38.0), (8, False, 22.0 + 16.0 / 8), (8, True, 38.0 / 8)):
        tp_a, sp_a = np.full(1, float(tp)), np.full(1, sp)
        parts = activations.activation_elements_per_layer(model, b, tp_a, sp_a, one, False)
        got = fused_elementwise_bytes(model, parts, model.seq_len * b, tp_a, sp_a, "bf16")
        assert got == pytest.approx(3.0 * forward_sbh * sbh)
    parts = activations.activation_elements_per_layer(model, b, one, np.zeros(1, bool), one, False)
    fp32 = fused_elementwise_bytes(model, parts, model.seq_len * b, one, np.zeros(1, bool), "fp32")
    assert fp32 == pytest.approx(2.0 * 3.0 * 38.0 * sbh)


def test_torch_ring_merges_move_the_bytes_counted_off_its_code() -> None:
    """elementwise.torch_ring_elementwise_bytes at cp 2 for Llama-3-8B (32 heads, 8 kv heads of
    128), 4096 local tokens: q = 4096 x 4096 elements, k = q / 4 (or q where the K/V heads are
    repeated before SDPA). Forward 8k per step for K/V copies, 12q of casts, 32.5q per merge;
    backward 17 + 47 cp bytes per K/V element and 10 + 11.5 cp per query element."""
    m = PRESETS["llama-3-8b"]
    q = 4096.0 * 4096.0

    def ring(cp, repeated):
        out = elementwise.torch_ring_elementwise_bytes(m, np.array(4096.0), np.array(1.0),
                                                   np.array(float(cp)), repeated)
        return float(out["forward"]), float(out["backward"])

    k = q / 4.0
    assert ring(2, False) == (pytest.approx(16 * k + 44.5 * q), pytest.approx(111 * k + 33 * q))
    assert ring(2, True) == (pytest.approx(60.5 * q), pytest.approx(144 * q))
    assert ring(1, True) == (0.0, 0.0)
    # more ring steps, more merges
    assert ring(8, True)[0] > ring(4, True)[0] > ring(2, True)[0]
