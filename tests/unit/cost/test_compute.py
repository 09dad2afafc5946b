"""FLOP counts and compute-time terms."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import compute
from autoplan.cost.params import total_params
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-13b", "gpt3-175b"])
def test_model_flops_match_megatron_formula(name: str) -> None:
    # Narayanan et al. 2021 (SC21), eq. 3 without recompute: 72 B s L h^2 (1 + s/6h + V/12Lh).
    m = PRESETS[name]
    s, L, h, V = m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    expected = 72 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert compute.model_flops_per_sequence(m) == pytest.approx(expected, rel=1e-9)


def test_model_flops_close_to_6N_per_token_for_short_sequences() -> None:
    m = PRESETS["llama-3-8b"].replace(seq_len=128)
    per_token = compute.model_flops_per_sequence(m) / m.seq_len
    # 6 FLOPs per parameter per token (Kaplan et al. 2020), less the input embedding: a lookup
    non_embedding = total_params(m) - m.vocab_size * m.hidden_size
    assert per_token == pytest.approx(6 * non_embedding, rel=0.02)


def test_gemm_time_uses_size_dependent_efficiency() -> None:
    prof = load_profile("a100-sxm4-80gb")
    peak = prof.device.peak("bf16")
    small, large = np.array(1e8), np.array(1e12)
    t_small = compute.gemm_time_s(small, prof, peak)
    t_large = compute.gemm_time_s(large, prof, peak)
    assert float(t_small) / 1e8 > 5 * float(t_large) / 1e12  # small GEMMs are less efficient


def test_tensor_parallel_splits_gemm_flops() -> None:
    m = PRESETS["gpt3-13b"]
    one = sum(compute.gemm_flops_per_layer(m, np.array(2048.0), np.array(1.0)))
    eight = sum(compute.gemm_flops_per_layer(m, np.array(2048.0), np.array(8.0)))
    assert float(one) == pytest.approx(8 * float(eight))
    assert float(one) == pytest.approx(24 * 2048 * m.hidden_size**2)  # 24 s h^2 forward
