"""Activation terms (cost/activations.py) against the published figures they come from."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import activations
from autoplan.model_spec import PRESETS, NormKind

# Korthikanti et al. 2022, Table 2: activation bytes per transformer layer.
GPT = PRESETS["gpt3-175b"].replace(dropout=0.1)
S, B, H, A = GPT.seq_len, 1, GPT.hidden_size, GPT.num_heads


def _per_layer(t: int, sp: bool, recompute: int) -> float:
    parts = activations.activation_elements_per_layer(
        GPT, np.array(B), np.array(t), np.array(sp), np.array(1), eager_attention=True)
    return float(activations.activation_bytes_per_layer(parts, np.array(recompute), "bf16"))


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


SPLIT = ("qkv", "attn_out", "mlp_act", "mlp_mid")
REPLICATED = ("norm", "gemm_in", "masks")


def test_flash_attention_keeps_no_square_matrices() -> None:
    eager = activations.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=True)
    flash = activations.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=False)
    assert float(flash["core"]) < float(eager["core"]) / 100
    for k in SPLIT:
        assert float(flash[k]) == float(eager[k])


def test_context_parallel_splits_the_sequence() -> None:
    one = activations.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=False)
    two = activations.activation_elements_per_layer(GPT, 1, 1, False, 2, eager_attention=False)
    for k in (*REPLICATED, *SPLIT, "core"):
        assert float(two[k]) == pytest.approx(float(one[k]) / 2)


def test_swiglu_and_gqa_terms() -> None:
    llama = PRESETS["llama-3-8b"]
    s, h, f = llama.seq_len, llama.hidden_size, llama.ffn
    kv = llama.kv_heads * llama.head_width
    for fused, product in ((True, 6), (False, 8)):
        parts = activations.activation_elements_per_layer(llama, 1, 1, False, 1,
                                                          eager_attention=False, fused_swiglu=fused)
        # Q, attention output (2sbh each), K and V (2sb*kv each); SwiGLU's gate and up GEMM
        # output (4sbf) and product (2sbf), plus silu's output (2sbf) when not fused
        assert sum(float(parts[k]) for k in SPLIT) == pytest.approx(
            s * (4 * h + 4 * kv + product * f))
    # no dropout masks; fused RMSNorm keeps its 16-bit input (2sbh per norm), the composite one
    # two fp32 temporaries (8sbh per norm): measured on the runtime's CPU block, see activations.py
    fused = activations.activation_elements_per_layer(llama, 1, 1, False, 1, eager_attention=False)
    composite = activations.activation_elements_per_layer(llama, 1, 1, False, 1,
                                                          eager_attention=False, fused_norm=False)
    assert float(fused["norm"]) == pytest.approx(4 * s * h)
    assert float(composite["norm"]) == pytest.approx(16 * s * h)
    assert float(composite["fp32_fixed"]) == pytest.approx(16 * s * h)
    assert float(fused["masks"]) == 0.0


@pytest.mark.parametrize("preset", ["llama-3-8b", "llama-3-70b"])
def test_megatron_selective_matches_report_theoretical_memory(preset) -> None:
    # Megatron-LM megatron/training/theoretical_memory_usage.py, compute_activation_memory:
    # s*b*h*(18 + 4*ffn/h) per layer with selective recompute and sequence parallelism (it
    # counts K and V as wide as Q and the MLP as 4sbf; GQA and SwiGLU's product differ a little)
    model = PRESETS[preset]
    s, h, f, t = model.seq_len, model.hidden_size, model.ffn, 8
    parts = activations.activation_elements_per_layer(model, 1, t, True, 1, eager_attention=False)
    ours = float(activations.activation_bytes_per_layer(parts, np.array(1), "bf16",
                                                        "attention-core"))
    megatron = s * h * (18 + 4 * f / h) / t
    assert ours == pytest.approx(megatron, rel=0.08)


def test_selective_kinds_keep_what_their_runtime_keeps() -> None:
    # GPT, tp = 1, flash: Megatron's keeps all but the core's row statistics; autoplan's
    # runtime keeps GEMM outputs (Q, K, V, the first MLP GEMM, both branch outputs: 20sbh,
    # measured with saved_tensors_hooks on the runtime's block); torchtitan's op-level policy
    # keeps Q, V, SDPA's output, every second matmul's output and the block input
    s, h = GPT.seq_len, GPT.hidden_size
    parts = activations.activation_elements_per_layer(GPT, 1, 1, False, 1, eager_attention=False)
    keep = {k: float(activations.activation_bytes_per_layer(parts, np.array(1), "bf16", k))
            for k in ("attention-core", "all-but-gemms", "op-sac")}
    none = float(activations.activation_bytes_per_layer(parts, np.array(0), "bf16"))
    assert keep["attention-core"] == pytest.approx(none - float(parts["core"]))
    assert keep["all-but-gemms"] == pytest.approx(20 * s * h)
    assert keep["op-sac"] == pytest.approx((4 + 2 + 8 + 2 + 2) * s * h + float(parts["core"]))


def test_repeated_kv_copies_are_kept_without_recompute_but_not_by_op_sac() -> None:
    # torchtitan's Attention repeats the 8 grouped K/V heads of Llama 3 8B to all 32 before
    # SDPA, which saves the copies: K and V as wide as Q, 2 x 2sb(a - kv)d more kept. Its
    # op-level policy re-runs the copies from wv's output: Q and V at their projections' widths
    llama = PRESETS["llama-3-8b"]
    s, d = llama.seq_len, llama.head_width
    a, kv = llama.num_heads, llama.kv_heads
    grouped, repeated = (activations.activation_elements_per_layer(
        llama, 1, 1, False, 1, eager_attention=False, kv_repeated=r) for r in (False, True))
    none = {name: float(activations.activation_bytes_per_layer(p, np.array(0), "bf16"))
            for name, p in (("grouped", grouped), ("repeated", repeated))}
    assert none["repeated"] - none["grouped"] == pytest.approx(2 * 2 * s * (a - kv) * d)
    op_sac = [float(activations.activation_bytes_per_layer(p, np.array(1), "bf16", "op-sac"))
              for p in (grouped, repeated)]
    assert op_sac[0] == op_sac[1]
    assert float(grouped["qv_gemm"]) == pytest.approx(2 * s * (a + kv) * d)


@pytest.mark.parametrize(("precision", "per_norm"), [("bf16", 8), ("fp32", 8)])
def test_rmsnorm_fp32_temporaries_do_not_double_in_fp32(precision, per_norm) -> None:
    # composite RMSNorm keeps x.float() and x.float() * rstd (fp32 in either precision) instead
    # of its 16-bit input; the rest of the block doubles from bf16 to fp32
    llama = PRESETS["tiny-llama"]
    gpt_like = llama.replace(norm=NormKind.LAYERNORM)
    kw = {"b": 1, "tp": 1, "sp": False, "cp": 1, "eager_attention": False, "fused_norm": False}
    rms = activations.activation_bytes_per_layer(
        activations.activation_elements_per_layer(llama, **kw), np.array(0), precision)
    ln = activations.activation_bytes_per_layer(
        activations.activation_elements_per_layer(gpt_like, **kw), np.array(0), precision)
    width = 2 if precision == "bf16" else 4
    s, h = llama.seq_len, llama.hidden_size
    # LayerNorm keeps its input in the activation dtype: width per element per norm
    assert float(rms - ln) == pytest.approx(2 * (per_norm - width) * s * h)
