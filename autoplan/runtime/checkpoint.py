"""Distributed checkpoints with torch.distributed.checkpoint (DCP), resharded on load.

State is keyed by layout-independent FQNs (get_state_dict over every model chunk, optimizer
state flattened per parameter), so a checkpoint saved under one plan loads under another
(different dp/tp/pp/ZeRO/world size). A checkpoint is only ever picked up whole: every rank
writes into `step-NNNNNNNN.tmp/`, then, after a barrier, rank 0 writes `meta.json` and renames
the folder to `step-NNNNNNNN/` (an atomic rename on one file system); stale `.tmp/` folders of a
killed save are removed, and only the newest `keep` intact checkpoints are kept (prune_intact:
a damaged one is neither counted nor deleted).

Loading trusts nothing in the folder (checkpoint_files: restricted metadata unpickler,
weights_only byte items), skips damaged checkpoints for the newest intact one, refuses a
different model, optimizer, batch, data or seed (checkpoint_compat), and re-pads the
vocabulary rows when tp changed. State this run needs that a whole checkpoint lacks (another
optimizer's) is a refusal, never damage.

A tied embedding/head weight is saved once, as `embed.tok.weight` (tied_embeddings.canonical),
so pp = 1 and pp > 1 checkpoints load into each other. The fp16 loss scale is saved too and
restored when the checkpoint has it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
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

from autoplan.errors import ConfigError
from autoplan.runtime import tied_embeddings
from autoplan.runtime.checkpoint_compat import (
    VOCAB_FQNS,
    RunSettings,
    check_resumable,
    check_settings,
    saved_optimizer,
)
from autoplan.runtime.checkpoint_files import (
    CheckpointRefused,
    CorruptCheckpoint,
    Intact,
    SafePlanner,
    SafeReader,
    clean_temporaries,
    complete_dirs,
    fallback_warning,
    verify,
)
from autoplan.runtime.checkpoint_names import step_dir

log = logging.getLogger(__name__)

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
DEFAULT_KEEP = 3


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint in `directory` that verifies whole, or None."""
    for path in complete_dirs(Path(directory)):
        try:
            return verify(path).path
        except CorruptCheckpoint:
            continue
    return None


def prune_intact(root: Path, keep: int) -> tuple[list[Path], list[Path]]:
    """Delete the intact checkpoints beyond the newest `keep` intact ones (0 keeps all);
    returns (deleted, damaged ones left in place).

    A damaged checkpoint (one `verify` refuses: a truncated file, unreadable or hostile
    metadata) is what a resume skips, so it does not count toward `keep`: counted, it took
    the place of an intact one, and a resume had one fewer to fall back on. It is not deleted
    either: it is the user's data (a truncated file may be a disk that filled, worth looking
    at), and deleting it without being asked is worse than leaving a folder the resume
    already skips with a warning; the caller names it instead."""
    if keep <= 0:
        return [], []
    intact: list[Path] = []
    damaged: list[Path] = []
    for path in complete_dirs(root):
        try:
            verify(path)
        except (CorruptCheckpoint, CheckpointRefused):
            damaged.append(path)
            continue
        intact.append(path)
    deleted = intact[keep:]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted, damaged


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / "meta.json").read_text())["step"])


class Checkpointer:
    """Saves and loads the model chunks and optimizers of this rank."""

    def __init__(self, directory: str | Path, parts: list[nn.Module],
                 optimizers: list, tied: bool = False, loss_scaler=None,
                 keep: int = DEFAULT_KEEP) -> None:
        self.root = Path(directory)
        self.parts, self.optimizers = parts, optimizers
        self.tied, self.loss_scaler = tied, loss_scaler
        self.keep = keep
        self._told_damaged: set[Path] = set()

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
        final = self.root / step_dir(step)
        tmp = self.root / f"{step_dir(step)}.tmp"
        rank = dist.get_rank()
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            clean_temporaries(self.root)  # this step's and any a killed save left
        dist.barrier()
        dcp.save(self._state(), checkpoint_id=str(tmp))
        dist.barrier()
        if rank == 0:
            (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            deleted, damaged = prune_intact(self.root, self.keep)
            for old in deleted:
                log.info("pruned checkpoint %s (keeping the newest %d intact)", old.name,
                         self.keep)
            for bad in sorted(set(damaged) - self._told_damaged):
                log.warning("left damaged checkpoint %s in place (not counted toward "
                            "--keep-checkpoints; remove it when it is no longer needed)",
                            bad.name)
                self._told_damaged.add(bad)
        dist.barrier()
        log.info("saved checkpoint %s", final)
        return final

    def load_newest(self, plan, spec, run: RunSettings | None = None) -> int | None:
        """Load the newest intact checkpoint that fits `plan`'s model (and `run`'s optimizer,
        batch, data and seed); returns its step, or None when the folder has none. Damaged ones
        are skipped with one warning; a different model or run, or a hostile file, is a
        ConfigError (the same decision on every rank)."""
        skipped: list[str] = []
        for path in complete_dirs(self.root):
            try:
                found = verify(path)
            except CorruptCheckpoint as err:
                skipped.append(str(err))
                continue
            note = check_resumable(found, plan, spec)
            run_note = check_settings(found, run) if run is not None else None
            try:
                step = self.load(found)
            except dcp.api.CheckpointException as err:
                skipped.append(f"{path.name}: {str(err).splitlines()[0][:200]}")
                continue
            warning = fallback_warning(found, skipped)
            if warning and dist.get_rank() == 0:
                log.warning("%s", warning)
            if dist.get_rank() == 0:
                for line in (note, run_note):
                    if line:
                        log.info("%s", line)
            return step
        if skipped:
            raise ConfigError("--checkpoint-dir", f"no intact checkpoint in {self.root} "
                              f"({skipped[0]})", "remove the damaged step-* folders, or "
                              "start without --resume in a new --checkpoint-dir")
        return None

    def load(self, found: Intact | Path) -> int:
        """Load a checkpoint saved under any plan into this layout; returns its step."""
        if not isinstance(found, Intact):
            found = verify(Path(found))
        path, saved = found.path, found.metadata.state_dict_metadata
        state = self._state()
        if "loss_scaler" in state and not any(k.startswith("loss_scaler.") for k in saved):
            del state["loss_scaler"]  # saved without fp16: keep the initial scale
        _check_keys(found, state)
        repad = _swap_vocab_tensors(state, saved)
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafePlanner())
        _repad(state, repad)
        for part, opt in zip(self.parts, self.optimizers, strict=True):
            model, optim = state["model"], state["optim"]
            if self.tied:
                model, optim = tied_embeddings.for_part(part, model, optim)
            set_model_state_dict(part, model, options=StateDictOptions(strict=False))
            set_optimizer_state_dict(part, opt, optim, options=_OPTIONS)
        if "loss_scaler" in state:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        log.info("resumed from %s (step %d)", path, found.step)
        return found.step


def _check_keys(found: Intact, state: dict) -> None:
    """Refuse a whole checkpoint that lacks state this run needs: DCP would raise a
    CheckpointException that reads like damage; it was saved with another optimizer."""
    saved = found.metadata.state_dict_metadata
    missing = [f"optim.{k}" for k in state["optim"] if f"optim.{k}" not in saved]
    if missing:
        by = saved_optimizer(found)
        raise ConfigError("--optimizer", f"{found.path.name} has no {missing[0]} "
                          f"({len(missing)} optimizer entries missing): it was saved with "
                          f"{by or 'another optimizer'}, not this one",
                          f"pass --optimizer {by or 'as saved'} to continue it, or start a new "
                          "run in an empty --checkpoint-dir")


def _swap_vocab_tensors(state: dict, saved: dict) -> dict:
    """Vocabulary-shaped tensors saved with another padding (another tp): put a plain tensor
    of the saved shape in their place for dcp.load; returns {(section, key): original}."""
    out = {}
    for section in ("model", "optim"):
        for key, value in state[section].items():
            md = saved.get(f"{section}.{key}")
            if (isinstance(value, torch.Tensor) and md is not None and hasattr(md, "size")
                    and any(f in key for f in VOCAB_FQNS) and tuple(md.size) != value.shape):
                out[(section, key)] = value
                state[section][key] = torch.empty(tuple(md.size), dtype=value.dtype)
    return out


@torch.no_grad()
def _repad(state: dict, originals: dict) -> None:
    """Copy the loaded real rows into the current padding (padding rows zero) and restore the
    original (possibly sharded) tensors in `state`."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for (section, key), orig in originals.items():
        loaded = state[section][key]
        full = torch.zeros(orig.shape, dtype=orig.dtype)
        rows = min(loaded.shape[0], orig.shape[0])
        full[:rows] = loaded[:rows]
        if isinstance(orig, DTensor):
            shard = distribute_tensor(full.to(orig.device), orig.device_mesh, orig.placements,
                                      src_data_rank=None)
            orig.to_local().copy_(shard.to_local())
        else:
            orig.copy_(full.to(orig.device))
        state[section][key] = orig
