"""Parameter counts: per layer, per embedding, per pipeline rank.

A transformer block (Vaswani et al. 2017; GPT-2/3 and Llama layouts) holds the QKV and output
projections, the MLP (two matrices for GELU, three for SwiGLU) and two norms.
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind

VOCAB_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by)."""


def padded_vocab(model: ModelSpec, tp: np.ndarray | int = 1) -> np.ndarray:
    multiple = VOCAB_MULTIPLE * np.asarray(tp)
    return -(-model.vocab_size // multiple) * multiple


def attention_params(model: ModelSpec) -> int:
    h, kv_width = model.hidden_size, model.kv_heads * model.head_width
    q_width = model.q_width  # num_heads * head_dim; h unless head_dim is set apart (Gemma, Qwen3)
    weights = h * (q_width + 2 * kv_width) + q_width * h  # QKV and output projection
    biases = (q_width + 2 * kv_width) + h if model.bias else 0
    return weights + biases


def mlp_params(model: ModelSpec) -> int:
    h, f = model.hidden_size, model.ffn
    matrices = 3 if model.gated_mlp else 2  # SwiGLU and GeGLU: gate, up, down
    biases = ((matrices - 1) * f + h) if model.bias else 0
    return matrices * h * f + biases


def norm_params(model: ModelSpec) -> int:
    return model.hidden_size * (2 if model.norm is NormKind.LAYERNORM else 1)


def layer_params(model: ModelSpec) -> int:
    """Parameters of one transformer block: attention, MLP and its two norms."""
    return attention_params(model) + mlp_params(model) + 2 * norm_params(model)


def tensors_per_layer(model: ModelSpec) -> int:
    """Parameter tensors of one block (optimizers over DTensors pay per tensor): q, k, v, o and
    two or three MLP weights, their biases, and two norms' weights (and biases)."""
    weights = 4 + (3 if model.mlp is MlpKind.SWIGLU else 2)
    norms = 2 * (2 if model.norm is NormKind.LAYERNORM else 1)
    return weights * (2 if model.bias else 1) + norms


def end_tensors(model: ModelSpec) -> int:
    """Parameter tensors outside the blocks: token (and position) embedding, final norm, head."""
    return (1 + (model.position is PositionKind.LEARNED)
            + (2 if model.norm is NormKind.LAYERNORM else 1) + (not model.tie_embeddings))


def embedding_params(model: ModelSpec, vocab: np.ndarray | int | None = None) -> np.ndarray:
    """Token embedding (vocab x h) plus the learned position table where there is one."""
    v = model.vocab_size if vocab is None else vocab
    pos = model.seq_len * model.hidden_size if model.position is PositionKind.LEARNED else 0
    return np.asarray(v) * model.hidden_size + pos


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model with the tokenizer's (unpadded) vocabulary."""
    head = 0 if model.tie_embeddings else model.vocab_size * model.hidden_size
    embed = int(embedding_params(model))
    return model.num_layers * layer_params(model) + embed + head + norm_params(model)


def params_per_rank(
    model: ModelSpec, tp: np.ndarray, pp: np.ndarray, layers_first: np.ndarray,
    layers_last: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters held by one GPU of the first and of the last pipeline stage.

    Block matrices split over tp (norms and row-parallel biases are replicated and counted in
    full: a few parts per million). The first stage holds the embedding, the last the output
    head; with pp > 1 a tied head is a second copy on the last stage (Megatron-LM).
    """
    tp, pp = np.asarray(tp), np.asarray(pp)
    v = padded_vocab(model, tp)
    block = layer_params(model) / tp
    embed = v * model.hidden_size / tp + (embedding_params(model, 0))
    head = v * model.hidden_size / tp
    single = pp == 1
    untied_head = 0 if model.tie_embeddings else head
    first = layers_first * block + embed + np.where(single, untied_head + norm_params(model), 0)
    last = np.where(single, first, layers_last * block + head + norm_params(model))
    return first, last
