"""`--set key=value` edits to a plan's mapping before the strict loader reads it: one edit's
syntax and YAML value (set_field), and a list of edits applied whatever their order (apply_sets).
Apart from plan.py (the plan itself) and plan_args.py (the flags) because estimate, export and
import each edit plans so."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from autoplan.errors import ConfigError
from autoplan.yaml_io import show
from autoplan.yaml_parse import safe_load_text


def set_field(data: dict[str, Any], assignment: str) -> None:
    """Apply one `--set a.b.c=value` to a plan mapping; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError("--set", f"got {show(assignment)}", "write key=value, e.g. parallel.tp=4")
    key, _, raw = assignment.partition("=")
    value = safe_load_text(raw, f"--set {key}", invalid_as_text=True) if raw else None
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError("--set", f"got {show(assignment)}", "write key=value, e.g. parallel.tp=4")
    put_field(data, parts, value)


def put_field(data: dict[str, Any], parts: Sequence[str], value: Any) -> None:
    """Set the field at `parts` (a dotted key's parts) to `value`, making the sections above it;
    exit 2 where one of them is not a section."""
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError("--set", f"{show('.'.join(parts))}: {show(part)} is not a section",
                              "check the key")
        node = child
    node[parts[-1]] = value


FieldPath = tuple[Any, ...]
"""A field's keys from the top of the plan, e.g. ("parallel", "tp")."""


def apply_sets(data: dict[str, Any], assignments: Sequence[str]) -> None:
    """Apply `--set key=value` edits to plan data, whatever their order: a field given twice
    must get the same value (exit 2 naming it otherwise), and a mapping (`parallel={tp: 2}`)
    replaces that section of the plan file, then merges with every other field set inside it
    (`parallel.pp=4`, another mapping)."""
    sections: list[FieldPath] = []
    fields: dict[FieldPath, Any] = {}
    for assignment in assignments:
        one: dict[str, Any] = {}
        set_field(one, assignment)  # the syntax and the YAML value of this one edit
        key: FieldPath = tuple(assignment.partition("=")[0].strip().split("."))
        value: Any = one
        for part in key:
            value = value[part]
        if isinstance(value, dict):
            sections.append(key)
        for path, leaf in _fields_of(key, value):
            _refuse_clash(fields, path, leaf)
            fields[path] = leaf
    for key in sorted(sections, key=len):  # whole sections first, then what they hold
        put_field(data, key, {})
    for path in sorted(fields, key=len):
        put_field(data, path, fields[path])


def _fields_of(key: FieldPath, value: Any) -> list[tuple[FieldPath, Any]]:
    """The fields a value sets under `key`: each value of a mapping in turn, else `key` itself
    (an empty mapping too: an empty section)."""
    if isinstance(value, dict) and value:
        return [f for k, v in value.items() for f in _fields_of((*key, k), v)]
    return [(key, value)]


def _same(a: Any, b: Any) -> bool:
    """One value given twice: equal and of one type (1 and true differ), a NaN the same as a
    NaN (the plan loader then names it: not a finite number)."""
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def _refuse_clash(fields: dict[FieldPath, Any], path: FieldPath, value: Any) -> None:
    """Refuse a field set before to another value, or a field inside one that is no section."""
    for other, given in fields.items():
        if other == path and not _same(given, value):
            raise ConfigError(f"--set {_dotted(path)}", f"given twice, as {show(given)} and "
                              f"as {show(value)}", "give it once, or the same value both times")
        for outer, held, inner in ((other, given, path), (path, value, other)):
            if _within(inner, outer) and not isinstance(held, dict):
                raise ConfigError(f"--set {_dotted(outer)}", f"got {show(held)} and --set "
                                  f"{_dotted(inner)}, which needs it to be a section",
                                  "drop one of them")


def _within(inner: FieldPath, outer: FieldPath) -> bool:
    return len(inner) > len(outer) and inner[:len(outer)] == outer


def _dotted(path: FieldPath) -> str:
    return ".".join(map(str, path))
