"""Where named profiles and search spaces live: a user directory first, then the package.

`profiles/` and `search_spaces/` ship inside the wheel as the packages `autoplan.profiles` and
`autoplan.search_spaces` (pyproject.toml maps the top-level folders at build time, so an editable
install reads the checkout's files as they are edited); they are read with importlib.resources.
A user directory is searched first: `$AUTOPLAN_PROFILES` / `$AUTOPLAN_SPACES`, else
`$XDG_CONFIG_HOME/autoplan/<kind>` (`~/.config/autoplan/<kind>`). Parsing is left to the callers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from autoplan.errors import AutoplanError, ConfigError


@dataclass(frozen=True)
class Kind:
    """One kind of named YAML file."""

    folder: str
    """Folder name in the checkout, in the wheel (as autoplan.<folder>) and in the user dir."""
    env: str
    """Environment variable naming the user directory."""


PROFILES = Kind("profiles", "AUTOPLAN_PROFILES")
SPACES = Kind("search_spaces", "AUTOPLAN_SPACES")

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
"""A name that is one plain file name: no separators, no leading dot, nothing to expand, and
short enough to be one (NAME_MAX is 255 bytes; `is_file` raises past it)."""


def user_dir(kind: Kind) -> Path:
    """The user's directory for `kind` (it need not exist)."""
    env = os.environ.get(kind.env)
    if env:
        return Path(env).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "autoplan" / kind.folder


def package_dir(kind: Kind) -> Path:
    """The built-in files of `kind` as shipped in the package (the checkout's folder under an
    editable install)."""
    try:
        root = resources.files(f"autoplan.{kind.folder}")
    except ModuleNotFoundError:
        raise AutoplanError(f"the installed autoplan lacks its package data autoplan.{kind.folder}"
                            ": reinstall it (pip install -e . or the wheel)") from None
    if not isinstance(root, Path):  # importable from a zip: not how wheels are installed
        raise AutoplanError(f"autoplan.{kind.folder} is not on the file system ({root})")
    return root


def search_dirs(kind: Kind) -> list[Path]:
    """Directories searched for a name, first match wins."""
    return [user_dir(kind), package_dir(kind)]


def is_name(ref: str | os.PathLike[str]) -> bool:
    """A reference without a suffix or a directory part is a name, anything else a path."""
    text = os.fspath(ref)
    return not Path(text).suffix and os.sep not in text and "/" not in text


def plan_profile_ref(ref: str) -> str:
    """The profile as a plan names it: a profile name as given, a path made absolute, so the
    plan loads from wherever it is trained, estimated or exported (a path as typed holds only
    from the directory the command ran in). Search and import write plans with it."""
    if is_name(ref):
        return ref
    return str(Path(ref).expanduser().resolve())


def names(kind: Kind) -> list[str]:
    """Every name of `kind`, the user's and the built-in ones, sorted."""
    found = {p.stem for d in search_dirs(kind) if d.is_dir() for p in d.glob("*.yaml")
             if _SAFE_NAME.fullmatch(p.stem)}
    return sorted(found)


def find(kind: Kind, name: str) -> Path | None:
    """The file a name refers to (user directory first), or None."""
    if not _SAFE_NAME.fullmatch(name):
        return None
    for d in search_dirs(kind):
        path = d / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def safe_name(name: str, field: str) -> str:
    """`name` as one plain file name, or a ConfigError naming `field`: a name never decides the
    directory a file is written to (`../../x`, `/abs/x`, `.hidden` are refused)."""
    if not _SAFE_NAME.fullmatch(name):
        raise ConfigError(field, f"{name!r} is not a plain file name",
                          "use letters, digits, '.', '_' and '-' (not starting with '.')")
    return name


def checkout_root() -> Path | None:
    """The source checkout the built-in files come from (an editable install), else None."""
    root = package_dir(PROFILES).parent
    if (root / "pyproject.toml").is_file() and (root / "autoplan" / "__init__.py").is_file():
        return root
    return None


def default_write_dir(kind: Kind) -> Path:
    """Where a command writes a new file of `kind` by default: the checkout's folder when run
    from inside the checkout the package comes from, the user directory everywhere else."""
    root = checkout_root()
    if root is not None and Path.cwd().resolve().is_relative_to(root.resolve()):
        return root / kind.folder
    return user_dir(kind)
