"""Pieces every sub-command shares: the --format flag, emitting data as json/yaml, rich consoles.

A sub-command module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>`; user mistakes are raised as `autoplan.errors.AutoplanError`
and `autoplan.commands.main` turns them into one line on stderr and the exit code.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from autoplan.errors import ConfigError
from autoplan.yaml_io import dump_yaml, to_dict

FORMATS = ("table", "json", "yaml")
MAX_COUNT = 2**40
"""Largest integer a command-line count takes (GPUs, tokens, sequences); as plan.MAX_INT."""
MAX_SEED = 2**32 - 1
"""Largest --seed (and --worker): numpy's and Optuna's seeds are 32-bit, and train combines seeds
with steps and FQN hashes below torch's 2**64 limit."""


def check_seed(flag: str, value: int) -> int:
    """Refuse a seed (or worker index) outside 0..MAX_SEED in one line, as `train --seed` does."""
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(flag, f"got {value}", f"expected 0 to {MAX_SEED}")
    return value


def count(low: int = 1, high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse `type=` for an integer from `low` to `high`, in plain ASCII digits."""

    def parse(text: str) -> int:
        digits = text.strip()
        body = digits[1:] if digits[:1] in "+-" else digits
        if not body.isascii() or not body.isdigit() or len(body) > 20:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}")
        value = int(digits)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {value}")
        return value

    parse.__name__ = "count"  # argparse names the type in some messages
    return parse


def add_format_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """--format; `help` where the command's default is not resolve_format's."""
    parser.add_argument(
        "--format", choices=FORMATS, default=None,
        help=help or "output format (default: table on a terminal, json otherwise)",
    )


def resolve_format(args: argparse.Namespace) -> str:
    fmt = getattr(args, "format", None)
    if fmt:
        return str(fmt)
    return "table" if sys.stdout.isatty() else "json"


class _StdoutConsole(Console):
    """A Console whose closed pipe raises BrokenPipeError, which `commands.main` ends with exit
    141 as it does for JSON, instead of rich's own quiet SystemExit(1) (Console.on_broken_pipe,
    documented as the method to override)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # drop what is still buffered
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def stdout_console() -> Console:
    return _StdoutConsole(soft_wrap=False, width=max(100, Console().width))


def stderr_console() -> Console:
    return Console(stderr=True)


def finite(value: Any) -> Any:
    """NaN and infinity as null, so JSON output is JSON (a diverged run's final loss is NaN,
    an unpriced profile's dollars)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(data: Any) -> str:
    """`data` as indented JSON that every parser reads: non-finite numbers as null."""
    return json.dumps(finite(to_dict(data)), indent=2, default=str, allow_nan=False)


def emit(args: argparse.Namespace, data: Any, render_table: Callable[[Console], None]) -> None:
    """Print `data` as JSON/YAML, or call `render_table` with a stdout console."""
    fmt = resolve_format(args)
    if fmt == "json":
        sys.stdout.write(json_text(data) + "\n")
    elif fmt == "yaml":
        sys.stdout.write(dump_yaml(to_dict(data)))
    else:
        render_table(stdout_console())
