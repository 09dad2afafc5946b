"""The built-in dense models (GPT-3, Llama 2, 3 and 3.1, Mistral 7B and the tiny CPU-test
models), each with the paper or config.json it is read from, and the norm fields of the MoE
presets. A catalogue of data kept apart from model_spec's shape rules, which assemble PRESETS
from it and moe_spec.moe_presets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.rope_scaling import LLAMA31_ROPE_SCALING, RopeScaling

if TYPE_CHECKING:
    from autoplan.model_spec import ModelSpec


def dense_presets() -> list[ModelSpec]:  # imported late: model_spec imports this module
    """GPT-3 (Brown et al. 2020), Llama 2 (Touvron et al. 2023), Llama 3 and 3.1 (Dubey et al.
    2024), Mistral 7B (Jiang et al. 2023) and the tiny models of the CPU runs and tests."""
    from autoplan.model_spec import (
        DEFAULT_ROPE_THETA,
        MlpKind,
        ModelSpec,
        NormKind,
        PositionKind,
    )

    def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
        # GPT-3 (Brown et al. 2020, Table 2.1): GPT-2 architecture, 2048 context, 50257 BPE tokens,
        # dense attention everywhere (we ignore the alternating sparse layers), tied embeddings.
        return ModelSpec(
            name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
            vocab_size=50257, seq_len=2048, tie_embeddings=True, dropout=0.1,
        )

    def _llama(
        name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int,
        rope_theta: float = DEFAULT_ROPE_THETA, rope_scaling: RopeScaling | None = None,
    ) -> ModelSpec:
        return ModelSpec(
            name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
            ffn_hidden_size=ffn, vocab_size=vocab, seq_len=seq, mlp=MlpKind.SWIGLU,
            norm=NormKind.RMSNORM, position=PositionKind.ROPE, bias=False, tie_embeddings=False,
            rope_theta=rope_theta, rope_scaling=rope_scaling,
        )

    return [
        _gpt3("gpt3-125m", 12, 768, 12),
        _gpt3("gpt3-350m", 24, 1024, 16),
        _gpt3("gpt3-760m", 24, 1536, 16),
        # Table 2.1 lists 24 heads of 128 for d_model 2048, which does not multiply out;
        # we keep the head size (128) and use 16 heads.
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        # Table 2.1 lists d_model 5140 with 40 heads of 128; 5120 = 40 * 128 is the usual reading.
        _gpt3("gpt3-13b", 40, 5120, 40),
        _gpt3("gpt3-175b", 96, 12288, 96),
        # Llama 2 (Touvron et al. 2023, Table 1 and the released params.json / config.json);
        # config.json "rope_theta": 10000.0, the default.
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        # Llama 3 / 3.1 (Dubey et al. 2024, Table 3: "RoPE theta 500,000";
        # meta-llama/Meta-Llama-3-8B and Llama-3.1-8B config.json "rope_theta": 500000.0);
        # 8192-token pre-training sequences. Llama 3.1 rotates with its rope_scaling (config.json
        # "rope_type": "llama3", factor 8, low 1, high 4, original 8192); Llama 3 without.
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0,
               LLAMA31_ROPE_SCALING),
        _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0,
               LLAMA31_ROPE_SCALING),
        _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.0,
               LLAMA31_ROPE_SCALING),
        # Mistral 7B (Jiang et al. 2023, Table 1); sliding-window attention is not modelled.
        # mistralai/Mistral-7B-v0.1 config.json "rope_theta": 10000.0 (v0.3's 1e6 is another
        # model: vocabulary 32768).
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 8192),
        # Tiny models for CPU runs and tests: byte-level vocabulary.
        ModelSpec(
            name="tiny", num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, seq_len=64
        ),
        _llama("tiny-llama", 4, 64, 4, 2, 176, 256, 64),
    ]


PRESET_NORMS = {
    # huggingface.co/Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B config.json "rms_norm_eps": 1e-06;
    # Qwen3MoeAttention normalises q and k per head (q_norm, k_norm over head_dim)
    "qwen3-30b-a3b": {"qk_norm": True, "norm_eps": 1e-6},
    "qwen3-235b-a22b": {"qk_norm": True, "norm_eps": 1e-6},
    # huggingface.co/deepseek-ai/DeepSeek-V3 config.json "rms_norm_eps": 1e-06 (its latent
    # norms are MLA's own, not qk_norm)
    "deepseek-v3": {"norm_eps": 1e-6},
}
"""Norm fields of the MoE presets (moe_spec.moe_presets builds their shapes); the other presets'
configs state 1e-5 (Llama 2 and 3, Mistral 7B, Mixtral, gpt-oss, GPT-2's LayerNorm)."""
