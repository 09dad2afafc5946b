"""Output files and directories that are whole or absent: atomic writes, a lock per output path,
no silent overwrite, and the permissions the user's umask asks for.

A file is written to a temporary file in its own directory and renamed into place (os.replace),
so a reader sees the old file or the new one, never half of one. A directory is built as a
temporary sibling and renamed into place. `check_*` refuse a bad target (under a regular file,
unwritable, a directory where a file goes, existing without --force) before any work starts.
Every refusal is a ConfigError (exit 2) naming the flag, the path and the fix. Several files
written as one result: autoplan.fileset.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from autoplan.errors import ConfigError
from autoplan.yaml_io import show


def umask() -> int:
    """The process umask (read from /proc where it can be, else set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What open() would give a new file: 0o666 less the umask (mkstemp's default is 0o600)."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """What mkdir() would give a new directory: 0o777 less the umask (mkdtemp's is 0o700)."""
    return 0o777 & ~umask()


def _existing_ancestor(path: Path) -> Path:
    q = path
    while not q.exists() and q != q.parent:
        q = q.parent
    return q


def _writable(folder: Path) -> bool:
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only and os.access(folder, os.W_OK | os.X_OK)


def _absolute(path: str | os.PathLike[str]) -> Path:
    """The path made absolute without resolving links, so `.` and `..` have a real name."""
    return Path(os.path.abspath(path))


def staging_folder(path: Path) -> Path:
    """Where the temporary sibling of output directory `path` goes: beside it, or inside it
    when `path` exists and only it (not its parent) can be written, or is a mount point (its
    parent is another file system, which no rename crosses)."""
    if path.is_dir() and (not _writable(path.parent) or os.path.ismount(path)):
        return path
    return path.parent


def check_parent(path: str | os.PathLike[str], field: str) -> None:
    """Refuse when the directory that would hold `path` cannot be made or written: a regular
    file on the way, or the first existing folder not writable (read-only or no permission)."""
    p = Path(path)
    base = _existing_ancestor(p.parent)
    if not base.is_dir():
        raise ConfigError(field, f"{str(p)!r} lies under {str(base)!r}, which is a file",
                          "choose a path outside it")
    read_only = bool(os.statvfs(base).f_flag & os.ST_RDONLY)
    if read_only or not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(field, f"cannot write in {str(base)!r} "
                          f"({'read-only file system' if read_only else 'permission denied'})",
                          "choose a directory you can write to")
    check_creatable(base, field)


def check_creatable(folder: Path, field: str) -> None:
    """Make and remove a folder in `folder`: access() says yes where mkdir fails (root in
    /proc or /sys, a full disk, a quota), and that is found now, not after the work."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".autoplan-probe-", dir=folder))
    except OSError as err:
        raise ConfigError(field, f"cannot create anything in {str(folder)!r} ({err.strerror})",
                          "choose a directory you can write to") from None


def check_file_target(path: str | os.PathLike[str], *, force: bool, field: str = "--out") -> Path:
    """Refuse a file target that is a directory, that exists (without force), or that cannot be
    written; call it before any work so a refusal costs nothing."""
    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError as err:  # a name longer than the file system takes (ENAMETOOLONG), ...
        raise ConfigError(field, f"cannot use {show(str(p))} ({err.strerror})",
                          "choose a shorter or valid path") from None
    if is_dir:
        raise ConfigError(field, f"{str(p)!r} is a directory", "give a file path")
    if (p.exists() or p.is_symlink()) and not force:
        raise ConfigError(field, f"{str(p)!r} already exists",
                          "choose another path or pass --force")
    check_parent(p, field)
    return p


def check_not_input(path: str | os.PathLike[str], source: str | os.PathLike[str], what: str,
                    field: str = "--out") -> None:
    """Refuse to write over one of the command's input files, --force or not (the same file
    through a symlink too)."""
    try:
        same = Path(path).exists() and os.path.samefile(path, source)
    except OSError:  # unreadable: the write reports it
        same = False
    if same:
        raise ConfigError(field, f"{str(path)!r} is {what} ({source})", "write to another path")


def check_dir_target(path: str | os.PathLike[str], *, force: bool, names: Iterable[str],
                     field: str = "--out") -> Path:
    """Refuse an output directory that is a file, cannot be written, or already holds one of
    `names` (the files this command writes) without force."""
    p = Path(path)
    names = tuple(names)
    if p.exists() and not p.is_dir():
        raise ConfigError(field, f"{str(p)!r} is a file", "give a directory path")
    if not p.is_dir():
        check_parent(p, field)  # it is made in its parent folder
    else:
        check_parent(p / "x", field)  # files are made or replaced inside it
        blocked = [n for n in names if (p / n).is_dir()]
        if blocked:
            raise ConfigError(field, f"{str(p / blocked[0])!r} is a directory",
                              "remove it or choose another directory")
        clash = [n for n in names if (p / n).exists()]
        if clash and not force:
            raise ConfigError(field, f"{str(p)!r} already holds {', '.join(clash)}",
                              "choose another directory or pass --force")
    return p


def make_parents(path: Path, field: str = "--out") -> list[Path]:
    """mkdir -p `path`; returns the folders it created, deepest last (for `remove_empty`).
    A folder that cannot be made (no such parent in /proc, no space, ...) is a ConfigError."""
    missing = []
    q = path
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        remove_empty(missing[::-1])
        raise ConfigError(field, f"cannot create the directory {show(str(path))} "
                          f"({err.strerror})", "choose a path in a folder you can write") from None
    return missing[::-1]


def remove_empty(created: list[Path]) -> None:
    """Undo `make_parents` after a failure: remove the folders it made, if still empty."""
    for q in reversed(created):
        try:
            q.rmdir()
        except OSError:
            return


def write_bytes(path: str | os.PathLike[str], data: bytes, *, force: bool = False,
                field: str = "--out") -> Path:
    """Write `data` to `path` atomically with mode 0o666 & ~umask; without force an existing
    file is never replaced (not even one that appears while this one is written)."""
    p = check_file_target(path, force=force, field=field)
    created = make_parents(p.parent, field)
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, p)
        else:
            _link_new(tmp, p, field)
    except BaseException as err:
        if tmp and os.path.lexists(tmp):
            os.unlink(tmp)
        remove_empty(created)
        if isinstance(err, OSError):  # no space left, a quota, a file system gone read-only
            raise ConfigError(field, f"cannot write {show(str(p))} ({err.strerror})",
                              "free some space or choose another path") from None
        raise
    return p


def _link_new(tmp: str, p: Path, field: str) -> None:
    """Move tmp to p only if p does not exist (a hard link fails on an existing name)."""
    try:
        os.link(tmp, p)
    except FileExistsError:
        raise ConfigError(field, f"{str(p)!r} already exists",
                          "choose another path or pass --force") from None
    except OSError as err:  # a file system without hard links
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        if p.exists():
            raise ConfigError(field, f"{str(p)!r} already exists",
                              "choose another path or pass --force") from None
        os.replace(tmp, p)
    else:
        os.unlink(tmp)


def write_text(path: str | os.PathLike[str], text: str, *, force: bool = False,
               field: str = "--out") -> Path:
    """`write_bytes` of UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"), force=force, field=field)


@contextmanager
def output_lock(path: str | os.PathLike[str], field: str = "--out") -> Iterator[Path]:
    """Hold an exclusive lock on output `path` (the sibling file `.NAME.lock`) while the block
    runs: a second autoplan asking for the same output is refused at once (exit 2) instead of
    racing it. The lock file is removed when the block ends."""
    import fcntl

    p = _absolute(path)
    created = make_parents(p.parent, field)
    lock = staging_folder(p) / f".{p.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            remove_empty(created)
            raise ConfigError(field, f"another autoplan is writing {str(p)!r} (it holds "
                              f"{str(lock)!r})", "wait for it to finish or choose another "
                              "path") from None
        try:  # the holder before us may have removed the lock file after we opened it
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    ok = False
    try:
        yield lock
        ok = True
    finally:
        os.unlink(lock)  # unlink while still holding it, then release
        os.close(fd)
        if not ok:
            remove_empty(created)


@contextmanager
def atomic_dir(path: str | os.PathLike[str], *, force: bool, names: Iterable[str],
               field: str = "--out", stale: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to fill; when the block ends without an error it
    becomes `path`, else it is removed and `path` is left as it was.

    `path` absent or empty: one rename. `path` holding only files named in `names` (an earlier
    result): the old folder is renamed aside, the new one into place, the old one removed.
    `path` the working directory (or a folder above it) or a mount point: filled file by file
    as below, so the folder stays the one the shell is in.
    `path` holding other files too, or in a folder that cannot be written: each new file
    replaces its namesake by os.replace and the other files stay (the set is not atomic then,
    each file is). `stale`: files an earlier result of the same command may have left that
    this one does not write (a report.html when this run has no --report); with force they go
    too, so the directory holds one result, never parts of two."""
    names = tuple(names)
    old = tuple(n for n in stale if n not in names) if force else ()
    check_dir_target(path, force=force, names=names, field=field)
    p = _absolute(path)
    created = make_parents(p.parent, field)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.tmp-", dir=staging_folder(p)))
    try:
        yield tmp
        os.chmod(tmp, dir_mode())
        check_dir_target(path, force=force, names=names, field=field)  # again, just before
        _commit(tmp, p, names, old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(created)
        raise


def _commit(tmp: Path, p: Path, names: tuple[str, ...], stale: tuple[str, ...] = ()) -> None:
    if tmp.parent == p or _in_use(p):  # staged inside (only the parent is read-only), or a
        _replace_each(tmp, p, stale)     # folder whose identity someone holds: fill it
        return
    if not p.exists() or not any(p.iterdir()):
        try:
            os.rename(tmp, p)  # replaces an empty directory too
            return
        except OSError as err:  # filled meanwhile by something that took no lock
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if set(os.listdir(p)) <= set(names) | set(stale):
        old = Path(tempfile.mkdtemp(prefix=f".{p.name}.old-", dir=p.parent))
        os.rename(p, old / "d")
        try:
            os.rename(tmp, p)
        except BaseException:
            os.rename(old / "d", p)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    _replace_each(tmp, p, stale)


def _in_use(p: Path) -> bool:
    """Whether the folder `p` must stay the folder it is rather than be replaced by a renamed
    one: it is this process's working directory (`search --out .` replaced the shell's folder
    with a new one, leaving the shell in a deleted folder), or a mount point, which a rename
    cannot replace (staged inside it: staging_folder). A folder above the working directory
    holds it, so it is never empty nor only a result, and is filled file by file anyway."""
    if not p.is_dir():
        return False
    try:
        here, target = Path.cwd().resolve(), p.resolve()
    except OSError:  # the working directory was removed under us
        return os.path.ismount(p)
    return here == target or os.path.ismount(p)


def _replace_each(tmp: Path, p: Path, stale: tuple[str, ...]) -> None:
    """Move each new file over its namesake in `p`, then remove the `stale` files (the other
    files in `p` are not ours and stay)."""
    for name in sorted(os.listdir(tmp)):
        os.replace(tmp / name, p / name)
    tmp.rmdir()
    for name in stale:
        if (p / name).is_file() or (p / name).is_symlink():
            (p / name).unlink()
