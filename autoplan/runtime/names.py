"""Canonical parameter names: strip the prefixes that wrappers add (DDP, checkpointing, compile)."""

from __future__ import annotations

_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def clean_fqn(fqn: str) -> str:
    """'module.layers.0._checkpoint_wrapped_module.attention.wq.weight' -> 'layers.0.attention...'"""
    for part in _WRAPPER_PARTS:
        fqn = fqn.replace(part, "")
    if fqn.startswith("module."):
        fqn = fqn[len("module.") :]
    return fqn
