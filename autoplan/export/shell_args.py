"""Shell argument lists as data: the flags of a launch script or a file of flags.

Handles `--flag value`, `--flag=value`, switches, comments, line continuations and simple
`NAME=value` variables; it does not run the shell. Typed getters raise ConfigError.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Collection

from autoplan.errors import ConfigError

_ASSIGNED = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Za-z_]\w*)=([^\s()'\"$;&|]+)[ \t]*$", re.M)
_REFERENCE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


_FUNCTION = re.compile(r"^\s*(?:function\s+[A-Za-z_][\w-]*\s*(?:\(\s*\))?|[A-Za-z_][\w-]*\s*\(\s*\))")


def _function_body_lines(lines: list[str]) -> set[int]:
    """Indices of the lines of shell function definitions (`name() {` ... `}`, `function
    name {` ...), by brace depth: their body runs when the function is called, not where it
    is written."""
    body: set[int] = set()
    depth, opened = 0, False
    for i, line in enumerate(lines):
        if depth == 0 and not opened and not _FUNCTION.match(line):
            continue
        body.add(i)
        opened = opened or "{" in line
        depth += line.count("{") - line.count("}")
        if opened and depth <= 0:
            depth, opened = 0, False
    return body


def expand_variables(text: str) -> str:
    """Substitute $NAME / ${NAME} where the text assigns NAME a plain value (NAME=8), as the
    shell reads it: a use takes the value assigned above it (TP=2 ... $TP ... TP=4 is 2); a use
    inside a function body, or above every assignment, takes the value the script ends with (a
    function runs where it is called, after the assignments); a value that names an assigned
    variable (TP=${SIZE}) takes its value."""
    lines = text.splitlines(keepends=True)
    body = _function_body_lines(lines)

    def substitute(line: str, values: dict[str, str], fallback: dict[str, str]) -> str:
        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            return values.get(name, fallback.get(name, m.group(0)))

        return _REFERENCE.sub(value, line)

    final: dict[str, str] = {}
    for line in lines:  # the values the script ends with, each assigned in order
        assignment = _ASSIGNED.match(substitute(line, final, {}))
        if assignment:
            final[assignment.group(1)] = assignment.group(2)
    seen: dict[str, str] = {}
    out = []
    for i, line in enumerate(lines):
        line = substitute(line, final if i in body else seen, final)
        assignment = _ASSIGNED.match(line)
        if assignment and i not in body:
            seen[assignment.group(1)] = assignment.group(2)
        out.append(line)
    return "".join(out)


def plain_int(raw: str | None) -> int | None:
    ok = raw is not None and raw.isascii() and raw.isdigit() and len(raw) <= 12
    return int(raw) if ok else None  # type: ignore[arg-type]


def parse_flags(text: str, switches: Collection[str]) -> dict[str, str | bool]:
    """`--flag value` / `--flag=value` / `--switch` from shell text; the last occurrence wins."""
    text = text.replace("\\\n", " ")
    try:
        lexer = shlex.shlex(text, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError as err:
        raise ConfigError(
            "FILE", f"cannot split the arguments ({err})", "check the quoting"
        ) from None
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--") or len(tok) == 2:
            continue
        if "=" in tok:
            name, _, value = tok.partition("=")
            flags[name] = value
        elif tok in switches or i >= len(tokens) or tokens[i].startswith("--"):
            flags[tok] = True
        else:
            flags[tok] = tokens[i]
            i += 1
    return flags


class Flags:
    def __init__(self, flags: dict[str, str | bool], what: str) -> None:
        self.flags, self.what = flags, what

    def has(self, name: str) -> bool:
        return self.flags.get(name) is True

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.flags.get(name, default)
        if value is True:
            raise ConfigError(f"{self.what} {name}", "has no value", "give it one")
        return value  # type: ignore[return-value]

    def integer(self, name: str, default: int | None = None) -> int | None:
        raw = self.text(name)
        if raw is None:
            return default
        body = raw.strip().removeprefix("-")
        if not body.isascii() or not body.isdigit() or len(body) > 15:  # int() takes "1_0", "٣"
            raise ConfigError(
                f"{self.what} {name}", f"got {raw[:60]!r}", "expected an integer below 10**15"
            )
        return int(raw)

    def number(self, name: str, default: float) -> float:
        raw = self.text(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(
                f"{self.what} {name}", f"got {raw[:60]!r}", "expected a number"
            ) from None
        if not math.isfinite(value):
            raise ConfigError(f"{self.what} {name}", f"got {raw!r}", "expected a finite number")
        return value

    def need(self, name: str) -> int:
        value = self.integer(name)
        if value is None:
            raise ConfigError(self.what, f"no {name}", "add it or pass --model")
        return value
