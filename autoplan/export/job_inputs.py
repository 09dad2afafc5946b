"""What a launcher export's job reads from disk besides its own script: the plan, the model and
profile files the plan names, and the training text (`--data`).

The torchrun and SLURM jobs read them where they lie, so the export pins each one: absolute
paths (load_plan reads a plan's relative paths from the plan's folder, plan_files.plan_file_paths,
so the job runs from any folder) and SHA-256 checks in the script (check_lines). Kubernetes
carries the plan, its model and profile inside the manifest (kubernetes.py); only its --data
lies in the pod.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, ModelSpec
from autoplan.plan import Plan
from autoplan.runtime.data_files import check_byte_vocab, corpus_files

PLAN_FILE_TARGETS = ("torchrun", "slurm")
"""Targets whose job reads the plan file where it lies (Kubernetes carries it in the manifest)."""


@dataclass(frozen=True)
class NamedFile:
    """A file the plan names by path, as the export read (and priced) it."""

    field: str
    """The plan field that names it: model or cluster.profile."""
    path: str
    """Absolute path of the file read (a model folder's config.json)."""
    sha256: str


def _file_of(field: str, ref: str) -> Path | None:
    """The file `ref` names in `field` as load_model / load_profile read it; None for a name
    (a model preset, a profile name)."""
    if field == "model":
        if ref in PRESETS:
            return None
        path = Path(ref)
        return path / "config.json" if path.is_dir() else path
    return None if resources.is_name(ref) else Path(ref)


def _refs(plan: Plan) -> list[tuple[str, str]]:
    refs = [("cluster.profile", plan.cluster.profile)]
    if isinstance(plan.model, str):  # an inline model is the plan's own text
        refs.insert(0, ("model", plan.model))
    return refs


def named_files(plan: Plan, plan_file: str | Path) -> tuple[NamedFile, ...]:
    """The files `plan` (read from `plan_file` by load_plan) names by path, hashed at the
    absolute paths the job opens. A file that does not exist here (another site's profile) is
    not hashed.

    load_plan has made every relative path absolute from the plan's folder (and expanded a
    '~' one) but a model named by a bare word that is no preset and no file in that folder:
    that it leaves as written, for each command to read from the folder it runs in, which for
    the exported job is wherever it is started: refused (exit 2, _refuse_relative)."""
    pinned: list[NamedFile] = []
    for field, ref in _refs(plan):
        file = _file_of(field, ref)
        if file is None:
            continue
        if not file.is_absolute():
            _refuse_relative(field, ref, Path(plan_file).resolve().parent)
        if file.is_file():  # the path as the job opens it: through any symlink, so a link
            pinned.append(NamedFile(field, str(file), _sha256(file)))  # repointed fails
    return tuple(pinned)


def _refuse_relative(field: str, ref: str, folder: Path) -> None:
    """Refuse a path load_plan left relative (named_files): say why it was left so and where
    each reads it."""
    here = Path(ref).resolve()
    why = f"is no model preset and no file in the plan's folder {folder}"
    raise ConfigError(
        field, f"{ref!r} {why}, so it stays as written and each command reads it from the "
        f"folder it runs in: {here} from here, but the exported job reads it from whatever "
        "folder it is started in",
        f"write it in the plan as {here} (absolute) or as a path relative to the plan's folder")


def check_lines(plan_path: str, plan_sha256: str | None,
                named: Sequence[NamedFile]) -> list[str]:
    """Script lines that stop the job (exit 2) unless the plan file is the one exported, and
    each file it names (`named`) the one read: their SHA-256 (coreutils sha256sum, reading the
    file on its stdin) at the absolute paths the job reads. Empty without a hash (a plan not
    read from a file).

    Every path is one shlex-quoted word, whatever it holds: sha256sum --check's own input
    would need a line break in a name escaped, and failed every plan in such a folder."""
    if plan_sha256 is None:
        return []
    lines = [f"# the plan exported, as priced (sha256): {plan_sha256}",
             *_check(plan_sha256, plan_path, shown(plan_path))]
    for file in named:
        lines += [f"# its {file.field}, as priced (sha256): {file.sha256}",
                  *_check(file.sha256, file.path, f"{shown(file.path)} ({file.field} of the "
                          "plan)")]
    return lines


def _check(sha256: str, path: str, what: str) -> list[str]:
    why = f"{what} is missing or changed since autoplan export priced it; export the plan again"
    # 2>/dev/null first: it also quiets bash's own line for a file the < cannot open
    return [f'[ "$(sha256sum 2>/dev/null < {shlex.quote(path)})" = "{sha256}  -" ] \\',
            f"  || {{ echo {shlex.quote(why)} >&2; exit 2; }}"]


def shown(path: str) -> str:
    """`path` for a one-line message or a script's comment: as it is, or quoted with its
    control characters escaped (repr) where it holds any (a line break would end the
    comment and start a command)."""
    return path if path.isprintable() else repr(path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_data(data: str, model: ModelSpec, *, in_pod: bool = False) -> None:
    """Refuse a --data that `autoplan train` would refuse, by train's own checks
    (runtime.data_files) short of reading the text: each file opened and sized, not read.
    `in_pod`: a path inside a Kubernetes pod, not on this machine: only that it is absolute
    (a relative one would resolve against the image's working directory)."""
    check_byte_vocab(model.vocab_size)
    if in_pod:
        if not data.startswith("/"):
            raise ConfigError("--data", f"{data[:80]!r} is relative, and the pods would resolve "
                              "it against the image's working directory",
                              "give the absolute path the pods read it at, e.g. /data/corpus "
                              "on a mounted volume or inside the image")
        return
    corpus_files(data, model.seq_len, _opened_size)


def _opened_size(path: Path) -> int:
    """The file's size in bytes, opened as train opens it (an OSError where it cannot be)."""
    with open(path, "rb") as fh:
        return os.fstat(fh.fileno()).st_size
