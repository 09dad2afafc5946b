"""Distributed checkpoints with torch.distributed.checkpoint (DCP), resharded on load.

State is keyed by layout-independent FQNs (get_state_dict over every model chunk, optimizer
state flattened per parameter), so a checkpoint saved under one plan loads under another
(different dp/tp/pp/ZeRO/world size). A checkpoint is only ever picked up whole: every rank
writes into `step-NNNNNNNN.tmp/`, then, after a barrier, rank 0 writes `meta.json` and renames
the folder to `step-NNNNNNNN/` (an atomic rename on one file system).

A tied embedding/head weight is saved once, as `embed.tok.weight` (tied_embeddings.canonical),
so pp = 1 and pp > 1 checkpoints load into each other. The fp16 loss scale is saved too and
restored when the checkpoint has it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from autoplan.runtime import tied_embeddings

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{8})$")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in `directory`, or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "meta.json").is_file()]
    return max(done, key=lambda p: p.name) if done else None


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / "meta.json").read_text())["step"])


class Checkpointer:
    """Saves and loads the model chunks and optimizers of this rank."""

    def __init__(self, directory: str | Path, parts: list[nn.Module],
                 optimizers: list, tied: bool = False, loss_scaler=None) -> None:
        self.root = Path(directory)
        self.parts, self.optimizers = parts, optimizers
        self.tied, self.loss_scaler = tied, loss_scaler

    def _state(self) -> dict[str, dict]:
        model: dict = {}
        optim: dict = {}
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            m = get_model_state_dict(part, options=_OPTIONS)
            o = get_optimizer_state_dict(part, opt, options=_OPTIONS)
            if self.tied:
                m, o = tied_embeddings.canonical(m, o)
            model.update(m)
            optim.update(o)
        state = {"model": model, "optim": optim}
        if self.loss_scaler is not None:
            state["loss_scaler"] = self.loss_scaler.state_dict()
        return state

    def save(self, step: int, meta: dict | None = None) -> Path:
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f"step-{step:08d}.tmp"
        rank = dist.get_rank()
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        dcp.save(self._state(), checkpoint_id=str(tmp))
        dist.barrier()
        if rank == 0:
            (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        dist.barrier()
        log.info("saved checkpoint %s", final)
        return final

    def load(self, path: Path) -> int:
        """Load a checkpoint saved under any plan into this layout; returns its step."""
        state = self._state()
        if "loss_scaler" in state and not _has_key(path, "loss_scaler."):
            del state["loss_scaler"]  # saved without fp16: keep the initial scale
        dcp.load(state, checkpoint_id=str(path))
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            model, optim = state["model"], state["optim"]
            if self.tied:
                model, optim = tied_embeddings.for_part(part, model, optim)
            set_model_state_dict(part, model, options=StateDictOptions(strict=False))
            set_optimizer_state_dict(part, opt, optim, options=_OPTIONS)
        if "loss_scaler" in state:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        step = checkpoint_step(path)
        log.info("resumed from %s (step %d)", path, step)
        return step


def _has_key(path: Path, prefix: str) -> bool:
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return any(k.startswith(prefix) for k in metadata.state_dict_metadata)
