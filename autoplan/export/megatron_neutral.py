"""Megatron flags that decide no plan field but that `export --to megatron` (and the
Megatron-DeepSpeed launch) write, read back knowingly so that importing autoplan's own export
says nothing: --max-position-embeddings, checked against --seq-length, and Megatron-FSDP's
checkpoint format and unfused gradient accumulation. What a plan cannot say stays "skipped".
"""

from __future__ import annotations

import logging

from autoplan.errors import ConfigError
from autoplan.export.shell_args import Flags

log = logging.getLogger(__name__)

POSITIONS = "--max-position-embeddings"
NO_FUSION = "--no-gradient-accumulation-fusion"
CKPT_FORMAT = "--ckpt-format"
NEUTRAL_SWITCHES = frozenset({NO_FUSION})
"""store_true flags among them (Megatron-LM: action='store_false',
dest='gradient_accumulation_fusion'); not misspelling targets: Megatron-Core's config field
gradient_accumulation_fusion, dashed, is one character pair away and no misspelling."""


def neutral_flags(f: Flags) -> frozenset[str]:
    """The flags of `f` read here rather than skipped. --ckpt-format says how checkpoints are
    saved, never how a step runs; --no-gradient-accumulation-fusion is read under
    --use-megatron-fsdp only, which requires it (docs/discussions/megatron-fsdp-user-guide) and
    the megatron runtime traits price as it runs: without Megatron-FSDP it unfuses the weight-
    gradient accumulation those traits price fused, which a plan cannot say (still skipped)."""
    read = {POSITIONS, CKPT_FORMAT}
    if f.has("--use-megatron-fsdp"):
        read.add(NO_FUSION)
    return frozenset(name for name in read if name in f.flags)


def check_positions(f: Flags, learned: bool, hidden: int) -> None:
    """--max-position-embeddings against --seq-length. validate_args asserts
    `args.max_position_embeddings >= args.seq_length` (NVIDIA/Megatron-LM and
    deepspeedai/Megatron-DeepSpeed megatron/.../arguments.py): less is refused, as Megatron
    refuses it. `learned`: the launch builds a learned position table of that many rows, of
    which the plan prices seq_len (cost/params.py), so a longer one is said; RoPE builds no
    table, and a longer maximum changes nothing the plan prices."""
    most, seq = f.integer("--max-position-embeddings"), f.integer("--seq-length")
    if most is None or seq is None:
        return
    if most < seq:
        raise ConfigError(f"{f.what} {POSITIONS}", f"{most} is below --seq-length {seq}",
                          f"give at least {seq}: Megatron asserts max_position_embeddings >= "
                          "seq_length")
    if learned and most > seq:
        log.warning("%s %s: %d learned positions, priced as the --seq-length %d the plan "
                    "trains on: the run holds %s parameters more than priced", f.what,
                    POSITIONS, most, seq, f"{(most - seq) * hidden:,}")
