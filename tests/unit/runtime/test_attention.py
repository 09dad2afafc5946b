"""plan.attention: eager (softmax(QK^T/sqrt(d)+mask)V, s x s probabilities kept) and flash
(SDPA) agree in fp32, and eager keeps the a*s^2*b probabilities the cost model charges for."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoplan.model_spec import PRESETS
from autoplan.plan import Attention as AttentionKind
from autoplan.runtime.models.init import materialize_and_init
from autoplan.runtime.models.layers import eager_attention, set_attention
from autoplan.runtime.models.transformer import build_meta_model

FP32_RTOL = 1e-5  # the suite's parity tolerance; measured differences are ~1e-7


def _model(name: str, kind: AttentionKind):
    spec = PRESETS[name]
    model = build_meta_model(spec)
    set_attention(model, kind)
    materialize_and_init(model, torch.device("cpu"), spec.num_layers, seed=0)
    return spec, model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_eager_matches_flash_in_fp32(name):
    spec, flash = _model(name, AttentionKind.FLASH)
    _, eager = _model(name, AttentionKind.EAGER)
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator()
                           .manual_seed(0))
    outs = []
    for model in (flash, eager):
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (lf, gf), (le, ge) = outs
    assert _rel(le, lf) < FP32_RTOL
    for n, g in gf.items():
        if not n.endswith("wk.bias"):  # exact gradient 0 (softmax shift invariance)
            assert _rel(ge[n], g) < FP32_RTOL, n


def test_eager_core_is_causal_with_the_queries_at_the_end_of_the_keys():
    """Context parallelism calls the core with 8 queries over 16 keys: the queries are keys
    8..15, so query t sees keys 0..8+t (SDPA given that mask densely is the reference)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 8, 16, generator=gen)
    k, v = (torch.randn(2, 4, 16, 16, generator=gen) for _ in range(2))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    mask = torch.cat([torch.ones(8, 8, dtype=torch.bool), causal], dim=1)  # (8, 16)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert _rel(eager_attention(q, k, v), want) < FP32_RTOL
    square = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert _rel(eager_attention(q, q, q), square) < FP32_RTOL


def _saved_bytes(model, tokens) -> int:
    """Bytes of distinct storages autograd keeps for backward during one forward."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens)
    return sum(seen.values())


def test_eager_keeps_the_s_by_s_probabilities():
    spec, flash = _model("tiny", AttentionKind.FLASH)
    _, eager = _model("tiny", AttentionKind.EAGER)
    b = 2
    tokens = torch.randint(0, spec.vocab_size, (b, spec.seq_len))
    extra = _saved_bytes(eager, tokens) - _saved_bytes(flash, tokens)
    probs = spec.num_layers * b * spec.num_heads * spec.seq_len**2 * 4  # fp32 a*s^2*b per layer
    # measured 532,480 B for 524,288 B of probabilities: + the (s, s) boolean mask per layer,
    # - SDPA's (b, a, s) row statistics; the cost model charges 2as^2b at 16 bits (= this at 32)
    assert probs <= extra <= 1.1 * probs, (extra, probs)
