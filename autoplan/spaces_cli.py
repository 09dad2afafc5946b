"""`autoplan spaces`: list the search spaces `--space` takes by name, or print one's YAML to copy
(`autoplan spaces default > my.yaml`). Reading and checking a space is autoplan.search_space's."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autoplan import resources
from autoplan.cli_common import add_format_argument, emit
from autoplan.display import terminal_width
from autoplan.errors import ConfigError
from autoplan.search_space import load_space
from autoplan.space_files import SPACES_DIR, available_spaces
from autoplan.yaml_io import did_you_mean, show


def register(sub: Any) -> None:
    p = sub.add_parser(
        "spaces", help="list search spaces, or print one to copy",
        description="List the search spaces `search --space` takes by name (a user folder's "
        "first, then the shipped ones), or print one's YAML as written: `autoplan spaces "
        "default > my.yaml` copies it, `search --space my.yaml` reads the copy.")
    p.add_argument("name", nargs="?", metavar="NAME", help="print this space's YAML file")
    p.add_argument("--shipped", action="store_true",
                   help="with NAME: the shipped space, also where a user folder's of that name "
                   "shadows it")
    add_format_argument(p, help="format of the list (default: table on a terminal, json "
                        "otherwise); NAME prints the YAML file as written")
    p.set_defaults(func=spaces_command)


def spaces_command(args: argparse.Namespace) -> int:
    if args.name is not None:
        return _print_space(args)
    if args.shipped:
        raise ConfigError("--shipped", "given without NAME",
                          "give the name of the space to print, e.g. `autoplan spaces default "
                          "--shipped`")
    rows: list[dict[str, Any]] = []
    for name in available_spaces():
        path = resources.find(resources.SPACES, name)
        assert path is not None  # listed because it is there
        try:
            space = load_space(name)
        except ConfigError as err:  # one broken file in $AUTOPLAN_SPACES hides no others
            sys.stderr.write(f"autoplan spaces: warning: skipped {path}: {err}\n")
            continue
        user = _is_user(path)
        rows.append({"name": name, "source": "user" if user else "shipped", "path": str(path),
                     "shadows_shipped": user and _shipped(name) is not None,
                     "description": space.description})

    def render(console: Console) -> None:
        t = Table(title="search spaces", caption=(
            f"user: {resources.user_dir(resources.SPACES)} (${resources.SPACES.env}; searched "
            f"first); shipped: {SPACES_DIR}. `autoplan spaces NAME > my.yaml` copies one, "
            "`search --space my.yaml` reads the copy"),
            box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
        for k in ("name", "source", "description"):
            t.add_column(k, no_wrap=k != "description")
        for r in rows:
            source = "user, over shipped" if r["shadows_shipped"] else r["source"]
            t.add_row(r["name"], source, r["description"])
        console.width = min(console.width, terminal_width())
        console.print(t)

    emit(args, rows, render)
    return 0


def _print_space(args: argparse.Namespace) -> int:
    """The space's file as written (comments kept), checked first: a copy that loads."""
    name = str(args.name)
    if args.format not in (None, "yaml"):
        raise ConfigError("--format", f"got {args.format} with NAME",
                          "leave --format out: NAME prints the space's YAML file as written "
                          "(drop NAME for the list of spaces)")
    if not resources.is_name(name):
        raise ConfigError("NAME", f"got the path {show(name)}",
                          "give a space name (`autoplan spaces` lists them); a file is read "
                          "as it is by `search --space PATH`")
    path = _shipped(name) if args.shipped else resources.find(resources.SPACES, name)
    if path is None:
        known = sorted(p.stem for p in SPACES_DIR.glob("*.yaml")) if args.shipped \
            else available_spaces()
        hint = did_you_mean(name, known)
        raise ConfigError("NAME", f"no {'shipped ' if args.shipped else ''}search space named "
                          f"{show(name)}", (f"{hint} " if hint else "")
                          + f"choose one of {', '.join(known)}")
    load_space(path if args.shipped else name)  # a broken user file is said, not copied
    if not args.shipped and _is_user(path) and _shipped(name) is not None:
        sys.stderr.write(f"autoplan spaces: note: {name} is the user's {path}, which shadows "
                         "the shipped one (--shipped prints that)\n")
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


def _is_user(path: Path) -> bool:
    return path.parent.resolve() != SPACES_DIR.resolve()


def _shipped(name: str) -> Path | None:
    """The shipped space of that name, whatever a user folder holds."""
    path = SPACES_DIR / f"{name}.yaml"
    return path if path.is_file() else None
