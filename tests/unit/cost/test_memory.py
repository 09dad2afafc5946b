"""Memory terms against the published figures they come from."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import memory
from autoplan.model_spec import PRESETS, NormKind


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    # Rajbhandari et al. 2020 (ZeRO), Figure 1: 7.5B parameters, 64-way data parallelism,
    # K = 12: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB per device.
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_model_states_match_zero_paper(zero: int, expected_gb: float) -> None:
    st = memory.model_state_bytes(np.array(7.5e9), np.array(zero), np.array(64), "fp16",
                                  grad_bytes=2.0)  # the paper's 16-bit gradients
    total = float(st["params"] + st["grads"] + st["optimizer"])
    assert total / 1e9 == pytest.approx(expected_gb, rel=0.02)


@pytest.mark.parametrize(("zero", "bytes_per_param"), [(0, 18.0), (1, 6.0 + 12.0 / 8)])
def test_default_mixed_precision_keeps_fp32_gradients_like_megatron(zero, bytes_per_param):
    # Megatron-Core distributed optimizer docs: 18 bytes per parameter without it,
    # 6 + 12/d with it (bf16 weights, fp32 main_grad, fp32 master + Adam sharded over d).
    st = memory.model_state_bytes(np.array(1e9), np.array(zero), np.array(8), "bf16")
    assert float(st["params"] + st["grads"] + st["optimizer"]) == pytest.approx(
        1e9 * bytes_per_param)


def test_pipelined_zero3_accumulates_unsharded() -> None:
    plain = memory.model_state_bytes(np.array(1e9), np.array(3), np.array(8), "bf16")
    acc = memory.model_state_bytes(np.array(1e9), np.array(3), np.array(8), "bf16",
                                   unsharded_accumulation=np.array(True))
    assert float(acc["grads"]) == 8 * float(plain["grads"]) == 4e9
    assert float(acc["params"]) == 8 * float(plain["params"]) == 2e9
    assert float(acc["optimizer"]) == float(plain["optimizer"])


def test_offload_moves_optimizer_and_grads_to_host() -> None:
    st = memory.model_state_bytes(np.array(1e9), np.array(2), np.array(1), "bf16",
                                  offload_optimizer=np.array(True))
    assert float(st["optimizer"]) == 0 and float(st["grads"]) == 0
    assert float(st["params"]) == 2e9
    host = memory.host_state_bytes(np.array(1e9), np.array(1), "bf16", np.array(True),
                                   np.array(False))
    assert float(host) == 16e9  # 12 bytes of Adam states + 4 of fp32 gradient per parameter


# Korthikanti et al. 2022, Table 2: activation bytes per transformer layer.
GPT = PRESETS["gpt3-175b"].replace(dropout=0.1)
S, B, H, A = GPT.seq_len, 1, GPT.hidden_size, GPT.num_heads


def _per_layer(t: int, sp: bool, recompute: int) -> float:
    parts = memory.activation_elements_per_layer(
        GPT, np.array(B), np.array(t), np.array(sp), np.array(1), eager_attention=True)
    return float(memory.activation_bytes_per_layer(parts, np.array(recompute), "bf16"))


@pytest.mark.parametrize(
    ("t", "sp", "recompute", "formula"),
    [
        (1, False, 0, S * B * H * (34 + 5 * A * S / H)),                        # no parallelism
        (8, False, 0, S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),          # tensor parallel
        (8, True, 0, S * B * H / 8 * (34 + 5 * A * S / H)),                      # + sequence par.
        (8, False, 1, S * B * H * (10 + 24 / 8)),                                # + selective
        (8, True, 1, S * B * H * 34 / 8),                                        # SP + selective
        (1, False, 2, 2 * S * B * H),                                            # full recompute
    ],
)
def test_activations_match_korthikanti_table2(t, sp, recompute, formula) -> None:
    assert _per_layer(t, sp, recompute) == pytest.approx(formula, rel=0.02)


def test_flash_attention_keeps_no_square_matrices() -> None:
    eager = memory.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=True)
    flash = memory.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=False)
    assert float(flash["core"]) < float(eager["core"]) / 100
    assert float(flash["split"]) == float(eager["split"])


def test_context_parallel_splits_the_sequence() -> None:
    one = memory.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=False)
    two = memory.activation_elements_per_layer(GPT, 1, 1, False, 2, eager_attention=False)
    for k in ("replicated", "split", "core"):
        assert float(two[k]) == pytest.approx(float(one[k]) / 2)


def test_swiglu_and_gqa_terms() -> None:
    llama = PRESETS["llama-3-8b"]
    parts = memory.activation_elements_per_layer(llama, 1, 1, False, 1, eager_attention=False)
    s, h, f = llama.seq_len, llama.hidden_size, llama.ffn
    kv = llama.kv_heads * llama.head_dim
    # Q, attention output (2sbh each), K and V (2sb*kv each), SwiGLU gate/up/product (8sbf)
    assert float(parts["split"]) == pytest.approx(s * (4 * h + 4 * kv + 8 * f))
    # no dropout masks; per RMSNorm its 16-bit output (2sbh) and, instead of the 16-bit input,
    # two fp32 temporaries (8sbh): measured on the runtime's block, see memory.py
    assert float(parts["replicated"]) == pytest.approx((4 + 16) * s * h)
    assert float(parts["replicated_fp32"]) == pytest.approx(16 * s * h)


@pytest.mark.parametrize(("precision", "per_norm"), [("bf16", 2 + 8), ("fp32", 4 + 8)])
def test_rmsnorm_fp32_temporaries_do_not_double_in_fp32(precision, per_norm) -> None:
    # composite RMSNorm keeps x.float() and x.float() * rstd (fp32 in either precision) and its
    # output (activation dtype); the rest of the block doubles from bf16 to fp32
    llama = PRESETS["tiny-llama"]
    gpt_like = llama.replace(norm=NormKind.LAYERNORM)
    kw = {"b": 1, "tp": 1, "sp": False, "cp": 1, "eager_attention": False}
    rms = memory.activation_bytes_per_layer(
        memory.activation_elements_per_layer(llama, **kw), np.array(0), precision)
    ln = memory.activation_bytes_per_layer(
        memory.activation_elements_per_layer(gpt_like, **kw), np.array(0), precision)
    width = 2 if precision == "bf16" else 4
    s, h = llama.seq_len, llama.hidden_size
    # LayerNorm keeps input and output in the activation dtype: 2 * width per norm
    assert float(rms - ln) == pytest.approx(2 * (per_norm - 2 * width) * s * h)
