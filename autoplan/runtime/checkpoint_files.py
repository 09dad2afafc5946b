"""Checkpoint folders read without trusting them, picked, pruned and checked against a plan.

A checkpoint folder is user data: its DCP `.metadata` is a pickle, and DCP's own
FileSystemReader.read_metadata and DefaultLoadPlanner.load_bytes unpickle without limits
(torch 2.11 and 2.13: `pickle.load` and `torch.load(weights_only=False)`; tensors already load
with weights_only=True in FileSystemReader.read_data). Here the metadata goes through an
unpickler that builds only DCP's metadata classes (the "Restricting Globals" recipe of the
Python pickle documentation) and every byte item through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from autoplan.errors import ConfigError

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_DIR = re.compile(r"^step-(\d+)\.tmp$")
"""Checkpoint.save names folders checkpoint_names.step_dir(step) (STEP_DIR_FORMAT, step-%08d):
eight digits, more past step 99,999,999."""

_ALLOWED_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}
"""What a DCP `.metadata` pickle names (measured on torch 2.13: the dataclasses of
torch.distributed.checkpoint.metadata, _StorageInfo, torch.Size, dtypes, the layout lookup
and the checkpoint path); dtypes are allowed by type below."""


class CheckpointRefused(ConfigError):
    """A checkpoint file asks to build something other than checkpoint metadata (exit 2)."""


class CorruptCheckpoint(Exception):
    """A checkpoint folder that is truncated or unreadable (the caller falls back)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, where: Path) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointRefused(
            str(self.where), f"refusing to unpickle {module}.{name} (a checkpoint's metadata "
            "holds only DCP metadata classes)", "this folder was not written by autoplan "
            "train; do not resume from it")


def read_metadata_file(path: Path) -> Metadata:
    """The DCP Metadata in `path`, built by the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f, path).load()
    except CheckpointRefused:
        raise
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RecursionError, MemoryError) as err:
        raise CorruptCheckpoint(f"{path}: unreadable metadata ({type(err).__name__})") from err
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise CorruptCheckpoint(f"{path}: not DCP metadata")
    return md


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata read builds only DCP's metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        md = read_metadata_file(Path(self.path) / name)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = getattr(self, "load_id", None)
        return md


class SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor items load with torch.load(weights_only=True)."""

    def load_bytes(self, read_item, value) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# -- picking, pruning, cleaning ----------------------------------------------------------------

@dataclass(frozen=True)
class Intact:
    path: Path
    step: int
    meta: dict
    metadata: Metadata


def complete_dirs(root: Path) -> list[Path]:
    """Renamed (whole) checkpoint folders, newest (the highest step number) first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if STEP_DIR.match(p.name) and p.is_dir()),
                  key=lambda p: (int(p.name[len("step-"):]), p.name), reverse=True)


def verify(path: Path) -> Intact:
    """Check one folder: meta.json, the metadata, and every data file long enough for the
    byte ranges the metadata names. Raises CorruptCheckpoint or CheckpointRefused."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        step = int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpoint(f"{path}/meta.json: unreadable ({type(err).__name__})") from err
    md = read_metadata_file(path / ".metadata")
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        rel = str(getattr(info, "relative_path", ""))
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        if not rel or os.sep in rel or rel.startswith("."):
            raise CorruptCheckpoint(f"{path}: bad data file name {rel!r}")
        need[rel] = max(need.get(rel, 0), end)
    for rel, end in need.items():
        f = path / rel
        size = f.stat().st_size if f.is_file() else -1
        if size < end:
            raise CorruptCheckpoint(f"{f}: {max(size, 0)} bytes, metadata needs {end}")
    return Intact(path, step, meta, md)


def newest_intact(root: str | Path) -> tuple[Intact | None, list[str]]:
    """The newest checkpoint that verifies, and why each newer one was skipped."""
    skipped: list[str] = []
    for path in complete_dirs(Path(root)):
        try:
            return verify(path), skipped
        except CorruptCheckpoint as err:
            skipped.append(str(err))
    return None, skipped


def fallback_warning(found: Intact | None, skipped: list[str]) -> str | None:
    """One line for the user when newer checkpoints were skipped as damaged."""
    if not skipped:
        return None
    to = f"resuming from {found.path.name} instead" if found else "no intact checkpoint is left"
    return f"skipped {len(skipped)} damaged checkpoint(s) ({skipped[0]}); {to}"


def prune(root: Path, keep: int) -> list[Path]:
    """Delete whole checkpoints beyond the newest `keep` (0 keeps all); returns the removed."""
    if keep <= 0:
        return []
    removed = complete_dirs(root)[keep:]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def clean_temporaries(root: str | Path) -> list[Path]:
    """Remove half-written `step-N.tmp/` folders left by a killed save."""
    root = Path(root)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if TMP_DIR.match(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
