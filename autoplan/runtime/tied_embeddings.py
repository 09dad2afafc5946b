"""Tied input embedding and output head (model.tie_embeddings) under tensor and pipeline parallelism.

- One stage holds both (pp = 1, or ZB-V's rank 0 holding stages 0 and 2pp-1 as two chunks):
  with tp > 1 the vocab-parallel embedding (RowwiseParallel) and the column-parallel head
  (ColwiseParallel) both shard the [vocab, hidden] weight on dim 0 over tp, so after
  parallelize_module, which gives each module its own DTensor, `retie` makes the head use the
  embedding's parameter again; FSDP2 then manages that one parameter.
- Different stages hold them (pp > 1): the first and the last stage each hold a copy, both
  initialised from the embedding's FQN. After backward the copies' gradients are summed over the
  "embedding group" (for each dp/cp/tp coordinate, the pp ranks holding stage 0 and the last
  stage) with torch.distributed.all_reduce, as Megatron-LM does, so both copies take the same
  optimizer step. Both copies are sharded the same way (same shape, same TP style, same FSDP
  mesh), so the local shards line up and the all-reduce runs on them.

Layout-independent names: the tied weight is saved once, as `embed.tok.weight` (model and
optimizer state), whatever the layout; a last-stage copy saves and loads under that name.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

EMBED_FQN = "embed.tok.weight"
HEAD_FQN = "output.weight"


def init_fqn(fqn: str, tied: bool) -> str:
    """The FQN whose seed initialises `fqn`: a tied head copy starts equal to the embedding."""
    return EMBED_FQN if tied and fqn == HEAD_FQN else fqn


def retie(model: nn.Module) -> None:
    """Make the head use the embedding's parameter (after parallelize_module split them)."""
    embed, head = getattr(model, "embed", None), getattr(model, "output", None)
    if embed is not None and head is not None:
        head.weight = embed.tok.weight


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def head_copy(part: nn.Module) -> nn.Parameter | None:
    """The head weight of a chunk that holds the head but not the embedding (a second copy)."""
    if getattr(part, "output", None) is not None and getattr(part, "embed", None) is None:
        return part.output.weight
    return None


def embedding_group_ranks(mesh, first_pp: int, last_pp: int) -> list[list[int]]:
    """For each non-pp coordinate, the global ranks at pp = first_pp and pp = last_pp."""
    grid = mesh.mesh  # (pp, dp_replicate, dp_shard, cp, tp) tensor of global ranks
    firsts, lasts = grid[first_pp].flatten().tolist(), grid[last_pp].flatten().tolist()
    return [[a, b] for a, b in zip(firsts, lasts, strict=True)]


class TiedEmbeddings:
    """This rank's copies of a tied embedding/head and the group that keeps them equal."""

    def __init__(self, parts: list[nn.Module], group, group_size: int) -> None:
        self.copies = [_tied_param(p) for p in parts if _tied_param(p) is not None]
        self.duplicates = [p for p in (head_copy(part) for part in parts) if p is not None]
        """Second copies: left out of the gradient norm (the first copy counts once)."""
        self.group, self.group_size = group, group_size

    @classmethod
    def build(cls, parts: list[nn.Module], mesh, pp: int, first_pp: int, last_pp: int,
              timeout: datetime.timedelta) -> TiedEmbeddings:
        """Collective over the world when pp > 2 (every rank creates every embedding group)."""
        group, size = None, 1
        if first_pp != last_pp:
            size = 2
            if pp == 2:  # the two stages' ranks are the whole pp group
                group = mesh["pp"].get_group()
            else:
                group, _ = dist.new_subgroups_by_enumeration(
                    embedding_group_ranks(mesh, first_pp, last_pp), timeout=timeout,
                    group_desc="tied_embeddings")
        return cls(parts, group, size)

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Sum the copies' gradients (on this rank, then over the embedding group)."""
        grads = [p.grad for p in self.copies if p.grad is not None]
        if len(grads) != len(self.copies):
            raise RuntimeError("a tied embedding copy has no gradient after backward")
        if not grads:
            return
        total = _local(grads[0])
        for g in grads[1:]:
            total.add_(_local(g))
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for g in grads[1:]:
            _local(g).copy_(total)


def _tied_param(part: nn.Module) -> nn.Parameter | None:
    embed = getattr(part, "embed", None)
    if embed is not None:
        return embed.tok.weight
    return head_copy(part)


# -- checkpoint names -------------------------------------------------------------------------

def _rename(key: str, old: str, new: str) -> str:
    for prefix in ("", "state.", "param_groups."):
        if key == prefix + old or key.startswith(prefix + old + "."):
            return prefix + new + key[len(prefix + old):]
    return key


def canonical(model_sd: dict, optim_sd: dict) -> tuple[dict, dict]:
    """One chunk's flattened state dicts with the tied weight under EMBED_FQN only."""
    if EMBED_FQN in model_sd:  # the head, if here, is the same parameter (or absent)
        model_sd = {k: v for k, v in model_sd.items() if k != HEAD_FQN}
        return model_sd, optim_sd
    return ({_rename(k, HEAD_FQN, EMBED_FQN): v for k, v in model_sd.items()},
            {_rename(k, HEAD_FQN, EMBED_FQN): v for k, v in optim_sd.items()})


def for_part(part: nn.Module, model_sd: dict, optim_sd: dict) -> tuple[dict, dict]:
    """Loaded canonical state dicts as chunk `part` names them (inverse of canonical)."""
    if head_copy(part) is None:
        model_sd = dict(model_sd)
        if getattr(part, "output", None) is not None and EMBED_FQN in model_sd:
            model_sd[HEAD_FQN] = model_sd[EMBED_FQN]
        return model_sd, optim_sd
    return ({_rename(k, EMBED_FQN, HEAD_FQN): v for k, v in model_sd.items()},
            {_rename(k, EMBED_FQN, HEAD_FQN): v for k, v in optim_sd.items()})
