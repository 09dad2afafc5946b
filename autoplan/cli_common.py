"""Pieces every sub-command shares: the --format flag, emitting data as json/yaml, rich consoles.

A sub-command module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>`; user mistakes are raised as `autoplan.errors.AutoplanError`
and `autoplan.commands.main` turns them into one line on stderr and the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from autoplan.yaml_io import dump_yaml, to_dict

FORMATS = ("table", "json", "yaml")


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=FORMATS, default=None,
        help="output format (default: table on a terminal, json otherwise)",
    )


def resolve_format(args: argparse.Namespace) -> str:
    fmt = getattr(args, "format", None)
    if fmt:
        return str(fmt)
    return "table" if sys.stdout.isatty() else "json"


def stdout_console() -> Console:
    return Console(soft_wrap=False, width=max(100, Console().width))


def stderr_console() -> Console:
    return Console(stderr=True)


def emit(args: argparse.Namespace, data: Any, render_table: Callable[[Console], None]) -> None:
    """Print `data` as JSON/YAML, or call `render_table` with a stdout console."""
    fmt = resolve_format(args)
    if fmt == "json":
        sys.stdout.write(json.dumps(to_dict(data), indent=2, default=str) + "\n")
    elif fmt == "yaml":
        sys.stdout.write(dump_yaml(to_dict(data)))
    else:
        render_table(stdout_console())
