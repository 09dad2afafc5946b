"""Several files written as one result (`write_texts`): all are staged first and renamed into
place together, and a failure puts back what was there, so an export's files never come from
two runs. Apart from fsutil, which writes one file or one directory at a time and which this
builds on.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from autoplan.errors import ConfigError
from autoplan.fsutil import _link_new, check_file_target, file_mode, make_parents, remove_empty
from autoplan.yaml_io import show


def write_texts(files: dict[Path, str], *, force: bool = False, field: str = "--out") -> None:
    """Write several UTF-8 files as one result: every file is staged beside its target first
    and renamed into place only when all are staged; a failure removes what was staged and
    placed (a file replaced under force gets its old content back where the file system has
    hard links), so no file of the set is left without the others."""
    for path in files:
        check_file_target(path, force=force, field=field)
    created: list[Path] = []
    staged: list[tuple[str, Path]] = []
    placed: list[tuple[Path, bool, str | None]] = []  # (target, existed, old file kept aside)
    current = next(iter(files), Path())
    try:
        for current, text in files.items():
            created += make_parents(current.parent, field)
            fd, tmp = tempfile.mkstemp(prefix=f".{current.name}.", suffix=".tmp",
                                       dir=current.parent)
            staged.append((tmp, current))
            os.fchmod(fd, file_mode())
            with os.fdopen(fd, "wb") as fh:
                fh.write(text.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, current in staged:
            existed = force and current.exists()
            old = _keep_aside(current) if existed else None
            if force:
                os.replace(tmp, current)
            else:
                _link_new(tmp, current, field)
            placed.append((current, existed, old))
    except BaseException as err:
        _roll_back(staged, placed)
        remove_empty(created)
        if isinstance(err, OSError):  # no space left, a quota, a file system gone read-only
            raise ConfigError(field, f"cannot write {show(str(current))} ({err.strerror}); "
                              "wrote none of the files", "free some space or choose another "
                              "path") from None
        raise
    for _, _, old in placed:
        if old is not None:
            os.unlink(old)


def _keep_aside(path: Path) -> str | None:
    """A hard link to the file at `path`, to put back if the set fails (None on a file system
    without hard links)."""
    while True:
        aside = path.parent / f".{path.name}.old-{os.urandom(4).hex()}"
        try:
            os.link(path, aside)
            return str(aside)
        except FileExistsError:
            continue
        except OSError as err:
            if err.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                return None
            raise


def _roll_back(staged: list[tuple[str, Path]], placed: list[tuple[Path, bool, str | None]]
               ) -> None:
    for tmp, _ in staged:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    for path, existed, old in reversed(placed):
        if old is not None:
            os.replace(old, path)
        elif not existed:
            path.unlink(missing_ok=True)

