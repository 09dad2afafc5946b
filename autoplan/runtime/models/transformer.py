"""The decoder-only transformer; layers live in an nn.ModuleDict keyed by their global index.

Parameter names (FQNs) therefore never depend on the layout: a pipeline stage is the same class
with the other layers (and the embedding or the head) deleted, which DCP resharding relies on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.model_spec import ModelSpec, PositionKind
from autoplan.runtime.models.layers import Attention, FeedForward, make_norm
from autoplan.runtime.models.mla import MultiHeadLatentAttention
from autoplan.runtime.models.moe import MoE


def vocab_rows(spec: ModelSpec, tp: int = 1) -> int:
    """Rows of the embedding and the head: the vocabulary padded as the cost model prices it
    (cost/params.py padded_vocab: a multiple of 128*tp, Megatron-LM's
    --make-vocab-size-divisible-by), so every tp shard is equal; the padded logits are masked
    out of the loss (parallelize.loss_function)."""
    from autoplan.cost.params import padded_vocab

    return int(padded_vocab(spec, tp))


class Embedding(nn.Module):
    """Token embedding plus, for GPT, a learned position table; output (b, s, h)."""

    def __init__(self, spec: ModelSpec, rows: int | None = None) -> None:
        super().__init__()
        self.tok = nn.Embedding(rows or vocab_rows(spec), spec.hidden_size)
        self.pos = (
            nn.Embedding(spec.seq_len, spec.hidden_size)
            if spec.position == PositionKind.LEARNED
            else None
        )
        self.context_parallel = None  # context_parallel.apply_cp sets it when cp > 1

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            s, cp = tokens.shape[1], self.context_parallel
            h = h + (self.pos.weight[:s] if cp is None
                     else self.pos.weight[cp.positions(s, tokens.device)])
        return h


class Block(nn.Module):
    """Pre-norm block: x + drop(attn(norm(x))), then h + drop(mlp(norm(h)))."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0, index: int = 0) -> None:
        super().__init__()
        self.dropout = dropout
        self.attention_norm = make_norm(spec)
        self.attention = (Attention(spec) if spec.mla is None
                          else MultiHeadLatentAttention(spec))  # MLA: models/mla.py
        self.ffn_norm = make_norm(spec)
        moe = spec.moe is not None and spec.moe.is_moe_layer(index)
        self.feed_forward = MoE(spec) if moe else FeedForward(spec)  # MoE: models/moe.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + F.dropout(self.attention(self.attention_norm(x)), self.dropout, self.training)
        return h + F.dropout(self.feed_forward(self.ffn_norm(h)), self.dropout, self.training)


class Transformer(nn.Module):
    """tokens (b, s) -> logits (b, s, V_padded); any of embed/norm/output may be None on a
    stage. `tp` decides the vocabulary padding (vocab_rows)."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0, tp: int = 1) -> None:
        super().__init__()
        self.spec = spec
        rows = vocab_rows(spec, tp)
        self.embed: nn.Module | None = Embedding(spec, rows)
        self.layers = nn.ModuleDict({str(i): Block(spec, dropout, i)
                                     for i in range(spec.num_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden_size, rows, bias=False)
        if spec.tie_embeddings:
            self.output.weight = self.embed.tok.weight  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        h = self.run_layers(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def run_layers(self, h: torch.Tensor) -> torch.Tensor:
        """The blocks in order; autoplan.runtime.recompute replaces it (on the instance) to
        checkpoint groups of blocks (Megatron's uniform method)."""
        for layer in self.layers.values():
            h = layer(h)
        return h


def build_meta_model(spec: ModelSpec, dropout: float = 0.0, tp: int = 1) -> Transformer:
    """The whole model on the meta device (no memory); materialise it after parallelising."""
    with torch.device("meta"):
        return Transformer(spec, dropout, tp)
