"""Search-space files: which exist (the user's folder, then the shipped ones), the file a name
refers to, the label a loaded space is shown under, and the file's spellings (`auto`, one value
for a list) as the fields hold them. search_space.py checks the values and builds the space."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.yaml_io import name_hint, show

SPACES_DIR = resources.package_dir(resources.SPACES)
"""The built-in spaces (package data); a user directory is searched first (autoplan.resources)."""
AUTO = "auto"
"""The YAML spelling of a knob the search derives (precision, pipeline.vpp, parallel.etp)."""
AUTO_KNOBS = (("pipeline", "vpp", "a list of integers >= 1, e.g. [1, 2, 4]"),
              ("parallel", "etp", "a list of integers >= 1, e.g. [1, 2]"))
"""Knobs whose YAML `auto` loads as null (derived per model and layout by the search)."""


def available_spaces() -> list[str]:
    """Space names: the user's directory ($AUTOPLAN_SPACES) and the built-in ones."""
    return resources.names(resources.SPACES)


def space_path(ref: str | Path) -> Path:
    """The file a space reference names: a name is looked up in the user's space directory,
    then the built-in ones, and refused when neither holds it; anything else is a path."""
    if not resources.is_name(ref):
        return Path(ref)
    given = str(ref)
    found = resources.find(resources.SPACES, given)
    if found is None:  # the profiles' suggestion rule (`defualt`: did you mean 'default'?)
        known = available_spaces()
        hint = name_hint(given, known)
        raise ConfigError("--space", f"no search space named {show(given)}",
                          (f"{hint} " if hint else "") + f"choose one of {', '.join(known)}"
                          " (`autoplan spaces` lists them) or give a path")
    return found


def space_label(given: str, name_in_file: str, user_file: Path | None) -> str:
    """The space as the user gave it: the name or path given, the file's own `name:` beside it
    where the two differ, and the user's file where it shadows a shipped space of that name
    (`default (user file ~/.config/autoplan/search_spaces/default.yaml, not the shipped one)`)."""
    notes = []
    if user_file is not None and (SPACES_DIR / f"{given}.yaml").is_file():
        notes.append(f"user file {user_file}, not the shipped one")
    stem = Path(given).stem if not resources.is_name(given) else given
    if name_in_file != stem:
        notes.append(f"name: {name_in_file}")
    return f"{given} ({'; '.join(notes)})" if notes else given


def listify(cls: type, data: Any) -> Any:
    """Accept a scalar wherever a list of values is expected (`precision: bf16`)."""
    if not isinstance(data, dict):
        return data
    hints = typing.get_type_hints(cls)
    out = dict(data)
    for name, value in data.items():
        tp = hints.get(name)
        if tp is None:
            continue
        union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
        if dataclasses.is_dataclass(inner[0]):
            out[name] = listify(inner[0], value)  # type: ignore[arg-type]
        elif typing.get_origin(inner[0]) is tuple and value is not None \
                and not isinstance(value, list):
            out[name] = [value]
    return out


def read_auto(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The file's `auto` as the fields hold it: null for AUTO_KNOBS, an empty list for precision
    and attention; an explicit null or empty list there is refused (write auto)."""
    data = _auto_knobs(data, where)
    if data.get("precision") in ("auto", ["auto"]):
        data = {**data, "precision": []}
    elif data.get("precision") == []:
        raise ConfigError(f"{where}: precision", "got an empty list",
                          "list at least one of bf16, fp16, fp32, fp8, or write auto")
    if data.get("attention") in ("auto", ["auto"]):
        data = {**data, "attention": []}
    elif data.get("attention") == []:
        raise ConfigError(f"{where}: attention", "got an empty list",
                          "list flash, eager or both, or write auto")
    return data


def _auto_knobs(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`auto` as null for AUTO_KNOBS; an explicit null there is refused (write auto)."""
    out = dict(data)
    for section, name, listed in AUTO_KNOBS:
        sub = data.get(section)
        if not isinstance(sub, dict) or name not in sub:
            continue
        value = sub[name]
        if value is None:
            raise ConfigError(f"{where}: {section}.{name}", "got null",
                              f"write {AUTO} (derived by the search) or {listed}")
        if value == AUTO or value == [AUTO]:
            out[section] = {**sub, name: None}
        elif isinstance(value, str) or (isinstance(value, list) and AUTO in value):
            raise ConfigError(f"{where}: {section}.{name}", f"got {show(value)}",
                              f"write {AUTO} alone or {listed}")
    return out
