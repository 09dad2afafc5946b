"""Decoder-only transformers built from a ModelSpec (GPT and Llama families)."""

from __future__ import annotations

from autoplan.runtime.models.transformer import Block, Embedding, Transformer

__all__ = ["Block", "Embedding", "Transformer"]
