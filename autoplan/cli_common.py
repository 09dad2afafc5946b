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
import re
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


_SUFFIX_POWER = {"k": 1, "m": 2, "b": 3, "g": 3, "t": 4}
"""Count suffixes, any case: k, M, B or G, T; a power of 1024 (binary) or of 1000 (decimal)."""
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?", re.ASCII)
"""A plain ASCII decimal number (float() alone also takes '８', '1_000', 'nan' and 'inf')."""
BINARY_NOTE = "k, M, G (or B), T are powers of 1024: 8k = 8192"
DECIMAL_NOTE = "k, M, B (or G), T are powers of 1000: 1T = 1e12"
"""What the suffixes mean, for the --help of a flag that takes them."""
_DURATION_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
               "w": 604800.0}
"""Units a duration flag takes besides its own (a bare number is in the flag's unit)."""


def scaled_number(text: str, *, binary: bool) -> float:
    """`text` as a number with an optional count suffix (k, M, B/G, T, any case): powers of 1024
    where `binary` (sequence lengths and batch sizes are powers of two: 8k = 8192), of 1000
    otherwise (token budgets: 1T = 1e12). ValueError for anything else or a non-finite value."""
    body = text.strip()
    power = _SUFFIX_POWER.get(body[-1:].lower(), 0) if len(body) > 1 else 0
    if power:
        body = body[:-1]
    if not _NUMBER.fullmatch(body) or (power and "e" in body.lower()):  # 1e3k: one scale
        raise ValueError(text)
    if not power and body.lstrip("+-").isdigit():
        return int(body)  # exact past 2**53, as int() reads it
    value = float(body) * (1024 if binary else 1000) ** power
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def scaled_count(text: str, *, binary: bool) -> int:
    """`text` as a whole number, a suffix allowed (scaled_number): ValueError where it is not
    one ('8.1k' at 1024 is 8294.4)."""
    value = scaled_number(text, binary=binary)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(text)
    return int(value)


def count(low: int | None = 1, high: int | None = MAX_COUNT, *, suffixes: str | None = None,
          example: str = "8") -> Callable[[str], int]:
    """An argparse `type=` for an integer from `low` to `high` in plain ASCII digits, or with
    `suffixes` ("binary" or "decimal") also a count suffix: 8k, 1.5M (scaled_number). A bad
    value is one line with the value and what to write (`example`: one the flag takes). None
    for both bounds leaves the range to the command (a seed's own message: check_seed)."""
    if suffixes not in (None, "binary", "decimal"):
        raise ValueError(f"suffixes: {suffixes!r}")

    def parse(text: str) -> int:
        try:
            if suffixes is None:
                digits = text.strip()
                body = digits[1:] if digits[:1] in "+-" else digits
                if not body.isascii() or not body.isdigit() or len(body) > 20:
                    raise ValueError(text)
                value = int(digits)
            else:
                value = scaled_count(text, binary=suffixes == "binary")
        except ValueError:
            how = f" ({BINARY_NOTE if suffixes == 'binary' else DECIMAL_NOTE})" if suffixes else ""
            plain = text.strip()
            if not suffixes and plain[-1:].lower() in _SUFFIX_POWER and plain[:-1].isdigit():
                how = " (a plain number here: no k, M, G suffix)"
            raise argparse.ArgumentTypeError(
                f"got {text[:40]!r}; write a whole number, e.g. {example}{how}") from None
        if low is not None and high is not None and not low <= value <= high:
            plain = text.strip()
            read = "" if plain == str(value) else f" (= {value:,})"
            raise argparse.ArgumentTypeError(f"got {plain[:40]!r}{read}; expected a whole number "
                                             f"from {low:,} to {high:,}")
        return value

    parse.__name__ = "count"  # argparse names the type in some messages
    return parse


def amount(what: str, example: str, *, suffixes: bool = True,
           positive: bool = True) -> Callable[[str], float]:
    """An argparse `type=` for a finite number of `what` (tokens, tokens/s; "" for a bare
    number) in plain ASCII, with a decimal count suffix allowed where `suffixes` (1T = 1e12,
    250k = 250000; not for a rate or a ratio: --lr 1k is no learning rate): one line naming
    the value and the fix otherwise. `positive` refuses 0 and below here; without it the range
    is left to the command (train's --dropout takes 0, its check names the interval)."""
    noun = f"a number of {what}" if what else "a number"
    note = f" ({DECIMAL_NOTE})" if suffixes else ""

    def parse(text: str) -> float:
        try:
            if suffixes:
                value = float(scaled_number(text, binary=False))
            elif _NUMBER.fullmatch(text.strip()) and math.isfinite(float(text)):
                value = float(text)
            else:
                raise ValueError(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"got {text[:40]!r}; write {noun}, e.g. {example}{note}") from None
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"got {text[:40]!r}; expected a positive "
                                             f"{noun.removeprefix('a ')}, e.g. {example}")
        return value

    parse.__name__ = "amount"
    return parse


def duration(unit: str, example: str) -> Callable[[str], float]:
    """An argparse `type=` for a positive finite duration in `unit` ("s" or "days"): a bare
    number is in that unit, and a number with a unit of _DURATION_S (100ms, 36h, 2w) is
    converted to it. `m` is refused (minutes or months?): min is minutes."""
    per_unit = {"s": 1.0, "days": 86400.0}[unit]
    units = ", ".join(_DURATION_S)

    def parse(text: str) -> float:
        body = text.strip()
        found = re.fullmatch(r"(.*?)\s*([A-Za-z]*)", body, re.ASCII)
        number, suffix = (found.group(1), found.group(2)) if found else (body, "")
        if suffix == "M":
            suffix = "m"  # minutes or months, as m
        suffix = suffix.lower()  # 36H as 36h, as counts take 8K
        fix = (f"write a number of {'seconds' if unit == 's' else 'days'}, e.g. {example}, "
               f"or one with a unit: {units}")
        if suffix == "m":
            raise argparse.ArgumentTypeError(f"got {text[:40]!r}: minutes or months?; write "
                                             f"min for minutes, e.g. {example}")
        if (suffix and suffix not in _DURATION_S) or not _NUMBER.fullmatch(number):
            raise argparse.ArgumentTypeError(f"got {text[:40]!r}; {fix}")
        value = float(number) * (_DURATION_S[suffix] / per_unit if suffix else 1.0)
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"got {text[:40]!r}; expected a positive time: "
                                             f"{fix}")
        return value

    parse.__name__ = "duration"
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
