"""Shell argument lists as data: the flags of a launch script or a file of flags.

Handles `--flag value`, `--flag=value`, switches, comments, line continuations and simple
`NAME=value` variables; it does not run the shell. Typed getters raise ConfigError.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Collection, Sequence

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

    def need(self, name: str, fix: str = "add it") -> int:
        """An integer flag the arguments must give; `fix`: what to do when they do not."""
        value = self.integer(name)
        if value is None:
            raise ConfigError(self.what, f"no {name}", fix)
        return value


NEAR_MISS = (0.85, 3)
"""A flag no one reads is taken for a misspelling of a flag we read from this difflib ratio, and
within this many characters changed (dashes for underscores free): --bf-16 (0.92 and one to
--bf16), --seq-len (0.86 and three to --seq-length), --hidden_size. A real flag that adds a
word to one we read (--encoder-tensor-model-parallel-size) is further off."""


def _changed(a: str, b: str) -> int:
    """Characters inserted, deleted or replaced to turn a into b (difflib's alignment)."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def near_miss(name: str, read: Collection[str]) -> str | None:
    """The flag in `read` that `name` misspells, if any (see NEAR_MISS)."""
    ratio, most = NEAR_MISS
    dashed = name.replace("_", "-")
    for close in difflib.get_close_matches(dashed, read, 3, ratio):
        if _changed(dashed, close) <= most:
            return close
    return None


def unread_flags(f: Flags, read: Collection[str], exempt: Collection[str], program: str) -> list[str]:
    """The flags in `f` that are not `read`, in order; one that misspells a `read` flag, unless
    `exempt` (a real flag near one we read), is refused, as the program's argparse
    (allow_abbrev=False) refuses a flag it does not define, rather than read as that flag's
    default."""
    unread = []
    for name in f.flags:
        if name in read:
            continue
        meant = None if name in exempt else near_miss(name, read)
        if meant is not None:
            raise ConfigError(f"{f.what} {name}", f"not a {program} flag",
                              f"did you mean {meant}?")
        unread.append(name)
    return unread


def launched_gpus(f: Flags, num_gpus: int | None, nodes: str,
                  per_node: Sequence[str]) -> int | None:
    """The job's GPU count: `num_gpus` (--num-gpus) or the launcher's `nodes` flag times its
    GPUs-per-node flag (the first of `per_node` given); None when neither says. Both given,
    they must agree: a --num-gpus other than the launch's would price another data-parallel
    size than the launch runs."""
    count = plain_int(f.text(nodes))
    flag = next((name for name in per_node if f.text(name) is not None), per_node[0])
    each = plain_int(f.text(flag))
    if count is None or each is None:
        return num_gpus
    launched = count * each
    if num_gpus is not None and num_gpus != launched:
        raise ConfigError("--num-gpus", f"{num_gpus}, but {f.what} launches {launched} GPUs "
                          f"({nodes} {count} x {flag} {each})",
                          f"pass --num-gpus {launched} or drop it, or correct the launch")
    return launched
