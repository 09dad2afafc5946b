"""Parameter counts: per layer, per embedding, per pipeline rank.

A transformer block (Vaswani et al. 2017; GPT-2/3 and Llama layouts) holds the QKV and output
projections, the MLP (two matrices for GELU, three for SwiGLU) and two norms; biases on every
Linear (model.bias, GPT) or on q, k and v alone (model.qkv_bias, Qwen2); per-head norms of q and
k (model.qk_norm, Qwen3).
"""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import ModelSpec, NormKind, PositionKind

VOCAB_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by)."""


def padded_vocab(model: ModelSpec, tp: np.ndarray | int = 1) -> np.ndarray:
    multiple = VOCAB_MULTIPLE * np.asarray(tp)
    return -(-model.vocab_size // multiple) * multiple


def attention_params(model: ModelSpec) -> int:
    if model.mla is not None:
        return mla_params(model)
    h, kv_width = model.hidden_size, model.kv_heads * model.head_width
    q_width = model.q_width  # num_heads * head_dim; h unless head_dim is set apart (Gemma, Qwen3)
    weights = h * (q_width + 2 * kv_width) + q_width * h  # QKV and output projection
    qkv_biases = q_width + 2 * kv_width if model.bias or model.qkv_bias else 0
    out = weights + qkv_biases + (h if model.bias else 0)  # the output projection's bias
    return out + qk_norm_params(model)


def qk_norm_params(model: ModelSpec) -> int:
    """QK-norm's two RMSNorm weights of head_dim, one for q and one for k, each shared by every
    head (HF Qwen3Attention q_norm / k_norm; Megatron-Core q_layernorm / k_layernorm built at
    hidden_size_per_attention_head): 2 * head_dim, 0 without it. Every tp rank holds them whole
    (they are per head, not split); params_per_rank divides them with the block, as it does
    the block norms: parts per million."""
    return 2 * model.head_width if model.qk_norm else 0


def mlp_params(model: ModelSpec) -> int:
    h, f = model.hidden_size, model.ffn
    matrices = 3 if model.gated_mlp else 2  # SwiGLU and GeGLU: gate, up, down
    biases = ((matrices - 1) * f + h) if model.bias else 0
    return matrices * h * f + biases


def mla_params(model: ModelSpec) -> int:
    """Multi-head latent attention (DeepSeek-V2 §2.1, eqs. 1-14; HF DeepseekV3Attention): query
    down (h x d_c') with its RMSNorm and up (d_c' x a*(d_h + d_R)), or one h x a*(d_h + d_R)
    projection; key/value down (h x (d_c + d_R)) with its norm and up (d_c x a*(d_h + d_v));
    output a*d_v x h."""
    mla, h, a = model.mla, model.hidden_size, model.num_heads
    assert mla is not None
    q_out = a * mla.qk_head_dim
    q = h * q_out if mla.q_lora_rank is None else mla.q_lora_rank * (h + 1 + q_out)
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank * (
        1 + a * (mla.qk_nope_head_dim + mla.v_head_dim))
    return q + kv + a * mla.v_head_dim * h


def tp_replicated_params(model: ModelSpec) -> int:
    """Block parameters every tp rank holds whole: MLA's query and key/value down projections
    (with the shared rotary key) and their latent norms (Megatron-Core MLASelfAttention keeps
    linear_q_down_proj / linear_kv_down_proj unsplit; runtime/tensor_parallel.mla_plan). 0
    without MLA; block norms are the few-parts-per-million params_per_rank leaves aside."""
    mla = model.mla
    if mla is None:
        return 0
    h = model.hidden_size
    q = 0 if mla.q_lora_rank is None else mla.q_lora_rank * (h + 1)
    return q + h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank


def expert_params(model: ModelSpec) -> int:
    """One routed (or shared) expert: an MLP of the model's kind at expert_ffn_hidden_size."""
    assert model.moe is not None
    return mlp_params(model.replace(ffn_hidden_size=model.moe.expert_ffn_hidden_size, moe=None))


def router_params(model: ModelSpec) -> int:
    """The router's h x E scores (with a bias for gpt-oss-style biased models) and DeepSeek-V3's
    aux-loss-free per-expert bias."""
    moe = model.moe
    assert moe is not None
    return moe.num_experts * (model.hidden_size + int(model.bias) + int(moe.router_aux_free))


def moe_layers(model: ModelSpec) -> int:
    """Blocks that route to experts (0 for a dense model)."""
    return 0 if model.moe is None else model.moe.moe_layers(model.num_layers)


def routed_expert_params(model: ModelSpec) -> int:
    """Routed expert weights of the whole model: what expert parallelism splits."""
    if model.moe is None:
        return 0
    return moe_layers(model) * model.moe.num_experts * expert_params(model)


def dense_block_params(model: ModelSpec) -> float:
    """Mean parameters of one block outside the routed experts: attention, norms, the dense MLP
    (dense blocks) or router and shared experts (MoE blocks); layer_params for a dense model."""
    return non_expert_block_params(model) / model.num_layers


def non_expert_block_params(model: ModelSpec) -> int:
    """All blocks' parameters outside the routed experts (the whole model's blocks if dense)."""
    if model.moe is None:
        return model.num_layers * layer_params(model)
    n_moe = moe_layers(model)
    return (model.num_layers - n_moe) * layer_params(model) + n_moe * moe_block_rest_params(model)


def moe_block_rest_params(model: ModelSpec) -> int:
    """One MoE block's parameters outside its routed experts: attention, norms, router and
    shared experts."""
    assert model.moe is not None
    return (attention_params(model) + 2 * norm_params(model) + router_params(model)
            + model.moe.num_shared_experts * expert_params(model))


def largest_block_unit(model: ModelSpec, tp: np.ndarray, ep: np.ndarray, etp: np.ndarray,
                       experts_apart: np.ndarray) -> np.ndarray:
    """Parameters per GPU of the largest block-sized unit ZeRO-3 gathers at once: a dense block
    split by tp, or a MoE block's rest split by tp with its E / (ep x etp) routed experts in the
    same unit, or (`experts_apart`) the larger of the two as units of their own (FSDP2 wrapping
    the experts apart: step_memory._buffers says where)."""
    tp = np.asarray(tp, float)
    dense = layer_params(model) / tp
    if model.moe is None:
        return dense
    routed = (model.moe.num_experts * expert_params(model)
              / (np.asarray(ep, float) * np.asarray(etp, float)))
    rest = moe_block_rest_params(model) / tp
    moe_unit = np.where(np.asarray(experts_apart), np.maximum(rest, routed), rest + routed)
    has_dense = moe_layers(model) < model.num_layers
    return np.maximum(moe_unit, dense) if has_dense else moe_unit


def active_params(model: ModelSpec, embedding: bool = True) -> int:
    """Parameters one token passes through: every non-expert weight, k routed experts and the
    shared ones in each MoE block. `embedding=False` leaves out the input embedding table (a
    lookup, not a GEMM), as the gpt-oss model card counts its 5.13B. total_params for a dense
    model."""
    full = total_params(model)
    if model.moe is not None:
        unused = model.moe.num_experts - model.moe.experts_per_token
        full -= moe_layers(model) * unused * expert_params(model)
    return full - (0 if embedding else int(embedding_params(model)))


def norm_params(model: ModelSpec) -> int:
    return model.hidden_size * (2 if model.norm is NormKind.LAYERNORM else 1)


def layer_params(model: ModelSpec) -> int:
    """Parameters of one transformer block: attention, MLP and its two norms."""
    return attention_params(model) + mlp_params(model) + 2 * norm_params(model)


def tensors_per_layer(model: ModelSpec) -> int:
    """Parameter tensors of one block (optimizers over DTensors pay per tensor): q, k, v, o and
    two or three MLP weights, their biases (or q, k and v's alone), two norms' weights (and
    biases), and QK-norm's two weights."""
    weights = 4 + (3 if model.gated_mlp else 2)
    norms = 2 * (2 if model.norm is NormKind.LAYERNORM else 1) + (2 if model.qk_norm else 0)
    return weights * (2 if model.bias else 1) + (3 if model.qkv_bias else 0) + norms


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
    if model.moe is not None:
        blocks = non_expert_block_params(model) + routed_expert_params(model)
        return blocks + embed + head + norm_params(model)
    return model.num_layers * layer_params(model) + embed + head + norm_params(model)


def mtp_block_params(model: ModelSpec) -> tuple[int, int]:
    """(non-expert, routed-expert) parameters of one multi-token-prediction depth: the block
    num_layers + d would be (MoE where moe.is_moe_layer says so, as DeepSeek-V3's layer 61;
    README_WEIGHTS.md: "structure identical to the Main Model hidden layers"), the 2h x h
    projection eh_proj and the two RMSNorms enorm and hnorm (report §2.2, eq. 21); the
    embedding and output head are the main model's (shared, not counted)."""
    h = model.hidden_size
    extra = 2 * h * h + 2 * norm_params(model)
    moe = model.moe
    if moe is None or not moe.is_moe_layer(model.num_layers):
        return layer_params(model) + extra, 0
    return moe_block_rest_params(model) + extra, moe.num_experts * expert_params(model)


def mtp_params(model: ModelSpec) -> int:
    """Parameters of the multi-token-prediction modules, apart from total_params (the main
    model's): DeepSeek-V3's one module, 11.5B unique parameters (README_WEIGHTS.md), the
    "14B" of its README counting the embedding and head its checkpoint stores again."""
    if not model.mtp_layers:
        return 0
    return model.mtp_layers * sum(mtp_block_params(model))


def params_per_rank(
    model: ModelSpec, tp: np.ndarray, pp: np.ndarray, layers_first: np.ndarray,
    layers_last: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters held by one GPU of the first and of the last pipeline stage.

    Block matrices split over tp, except MLA's down projections (tp_replicated_params; block
    norms and row-parallel biases, replicated too, are divided with the rest: parts per million). The first stage holds the embedding, the last the output
    head; with pp > 1 a tied head is a second copy on the last stage (Megatron-LM). Routed
    experts are not included: expert_params_per_rank counts them (sharded by ep x etp).
    """
    tp, pp = np.asarray(tp), np.asarray(pp)
    v = padded_vocab(model, tp)
    whole = tp_replicated_params(model)
    block = ((layer_params(model) if model.moe is None else dense_block_params(model)) - whole
             ) / tp + whole
    embed = v * model.hidden_size / tp + (embedding_params(model, 0))
    head = v * model.hidden_size / tp
    single = pp == 1
    untied_head = 0 if model.tie_embeddings else head
    first = layers_first * block + embed + np.where(single, untied_head + norm_params(model), 0)
    last = np.where(single, first, layers_last * block + head + norm_params(model))
    return first, last


def expert_params_per_rank(model: ModelSpec, ep: np.ndarray, etp: np.ndarray,
                           layers: np.ndarray) -> np.ndarray:
    """Routed expert parameters on one GPU of a stage of `layers` blocks: E/ep experts per MoE
    block, each split etp ways (Megatron-Core expert parallelism, docs "MoE": experts are
    distributed over the EP group, then tensor-split over expert-TP). MoE blocks are taken as
    spread evenly over the stages (moe_layers / L of each stage's blocks); 0 for dense."""
    if model.moe is None:
        return 0.0 * np.asarray(layers, float)
    share = moe_layers(model) / model.num_layers
    per_layer = model.moe.num_experts * expert_params(model)
    return np.asarray(layers, float) * share * per_layer / (np.asarray(ep, float)
                                                           * np.asarray(etp, float))
