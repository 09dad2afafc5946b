"""Strict YAML <-> frozen dataclass conversion.

Unknown keys are errors that name the key a typo meant and list the valid ones, enums load by
their YAML spelling, numbers are type-checked, and every save reloads the file and compares it
with what was meant to be written. Files are written atomically and never silently overwritten.
Parsing text is yaml_parse's (bounded and strict).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import re
import tempfile
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from autoplan.errors import ConfigError
from autoplan.yaml_parse import NotYaml, load_json_text, safe_load_text, show

T = TypeVar("T")
_YAML11_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
SCHEMA_VERSION = 1
MAX_FILE_INT = 2**53
"""Largest integer a loaded field takes: float64 holds every integer up to it exactly, and numpy
int64 holds it; ModelSpec and Plan bound their fields tighter."""


EQUALLY_CLOSE = 0.05
"""did_you_mean names a second match only this near the best one's difflib ratio: --batch-size
gets both --micro-batch-size and --global-batch-size, --step only --steps (not --seed)."""


def did_you_mean(name: Any, known: Iterable[str], n: int = 1, quote: bool = True) -> str | None:
    """'did you mean 'x'?' naming the entries of `known` that `name` likely misspells
    (close_matches), or None when none is close. `quote`: each shown as repr (YAML keys), else
    as is (command-line flags)."""
    if not isinstance(name, str):
        return None
    close = close_matches(name, known, n)
    if not close:
        return None
    return f"did you mean {' or '.join(repr(c) if quote else c for c in close)}?"


def close_matches(name: str, known: Iterable[str], n: int = 1) -> list[str]:
    """The entries of `known` that `name` likely misspells: difflib.get_close_matches (ratio 0.6
    or more), at most `n`, and past the best only those EQUALLY_CLOSE to it."""
    close = difflib.get_close_matches(name, list(known), n)
    ratios = [difflib.SequenceMatcher(None, name, c).ratio() for c in close]
    return [c for c, r in zip(close, ratios, strict=True) if r >= ratios[0] - EQUALLY_CLOSE]


NAMES_SHOWN = 3
"""name_hint names at most this many presets or profiles (`a100` holds three profile names)."""


def name_hint(name: Any, known: Iterable[str]) -> str | None:
    """'did you mean ...?' for an unknown preset, profile or search-space name, compared
    without case. The rule, first that applies:
    1. the names equal to it but for case (`llama-3-8B`);
    2. the names holding every '-'-separated token typed, each inside one of the name's tokens
       (`a100-80gb`: a100-sxm4-80gb and a100-80gb-opa), up to NAMES_SHOWN, in token_matches' order;
       more than that is a guess, so None (the list of names that follows shows them);
    3. the close spellings (close_matches: `defualt` -> default).
    None when no name is near."""
    if not isinstance(name, str) or not name.strip():
        return None
    known = list(known)
    folded = name.strip().casefold()
    same = [k for k in known if k.casefold() == folded]
    held = token_matches(folded, known) if len(folded) >= 3 else []
    for picks in (same, held):
        if 0 < len(picks) <= NAMES_SHOWN:
            return f"did you mean {' or '.join(map(repr, picks))}?"
    if held:  # `gpt3` is in eight presets: which one is meant, the list that follows shows
        return None
    by_folded = {k.casefold(): k for k in known}
    close = close_matches(folded, by_folded, NAMES_SHOWN)
    return f"did you mean {' or '.join(repr(by_folded[c]) for c in close)}?" if close else None


def token_matches(name: str, known: Iterable[str]) -> list[str]:
    """The entries of `known` holding every '-'-separated token of `name` inside one of their
    own tokens (without case), ordered most likely meant first, on three keys in turn:
    - the typed first and last tokens at the name's ends: what is added sits between them, a
      qualifier (`a100-80gb` -> a100-sxm4-80gb, the form factor) rather than after them, a
      variant (a100-80gb-opa, one Omni-Path cluster);
    - fewer tokens that nothing typed matches (less the user left out);
    - the closer spelling (difflib ratio: `h100` -> h100-sxm-80gb before h100-96gb-500w)."""
    typed = [t for t in name.casefold().split("-") if t]

    def parts(entry: str) -> list[str]:
        return entry.casefold().split("-")

    def holds(entry: str) -> bool:
        return bool(typed) and all(any(t in p for p in parts(entry)) for t in typed)

    def key(entry: str) -> tuple[int, int, float]:
        own = parts(entry)
        ends = (typed[0] in own[0]) + (typed[-1] in own[-1])
        untyped = sum(not any(t in p for t in typed) for p in own)
        return -ends, untyped, -difflib.SequenceMatcher(None, name, entry.casefold()).ratio()

    return sorted((k for k in known if holds(k)), key=key)


def unknown_key_fix(key: Any, known: Iterable[str]) -> str:
    """The fix of an unknown key's error: the key it likely misspells, then every valid key."""
    known = list(known)
    valid = f"valid keys: {', '.join(known)}"
    hint = did_you_mean(key, known)
    return f"{hint} {valid}" if hint else valid



def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Convert one YAML value to the annotated type `tp`, or raise ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        for candidate in inner:  # first type that accepts the value wins
            try:
                return _convert(candidate, value, where)
            except ConfigError:
                continue
        raise ConfigError(where, f"got {show(value)}", f"expected one of {[_tn(a) for a in inner]}")
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)  # type: ignore[arg-type]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = [m.value for m in tp]
        if isinstance(value, tp):
            return value
        if value not in choices:
            raise ConfigError(where, f"got {show(value)}", f"choose one of {', '.join(map(str, choices))}")
        return tp(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected an integer")
        if abs(value) > MAX_FILE_INT:
            raise ConfigError(where, f"got {show(value)}", "expected an integer up to 2**53")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.match(value):
            value = float(value)  # PyYAML reads 1e12 (no dot, no sign) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected a number")
        if not math.isfinite(value):
            raise ConfigError(where, f"got {show(value)}", "expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected a string")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected a list")
        item_tp = args[0] if args else Any
        return tuple(_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"got {show(value)} ({_type_name(value)})", "expected a mapping")
        key_tp, val_tp = args if args else (Any, Any)
        return {
            _convert(key_tp, k, f"{where}"): _convert(val_tp, v, f"{where}.{k}")
            for k, v in value.items()
        }
    raise TypeError(f"yaml_io cannot convert to {tp!r} at {where}")  # programming error


def _tn(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def from_dict(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass `cls` from a mapping, strictly. `where` is the dotted path for errors."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {show(data)} ({_type_name(data)})", "expected a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            shown = (key if isinstance(key, str) and key.isprintable() and key.strip()
                     and len(key) <= 100 else show(key, 100))
            raise ConfigError(
                f"{where}.{shown}" if where else str(shown),
                "unknown key",
                unknown_key_fix(key, fields),
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        path = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(path, "missing", f"add '{name}:' to the file")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        if where and not err.field.startswith(where):
            raise ConfigError(f"{where}.{err.field}", err.problem, err.fix) from None
        raise


def to_dict(obj: Any) -> Any:
    """Dataclasses, enums and tuples to plain YAML-ready Python values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """Read a YAML file with `yaml.safe_load`; missing or malformed files raise ConfigError on
    `what` and the path. A .json file YAML cannot parse is read as JSON (tabs indenting JSON
    are no YAML), and what is wrong with it said as JSON's (load_json_text)."""
    p = Path(path)
    try:
        found, exists, is_dir = p.is_file(), p.exists(), p.is_dir()
    except OSError as err:  # a name past NAME_MAX, a path through a file without access
        raise ConfigError(what, f"cannot open {show(str(p), 120)} ({err.strerror})") from None
    if is_dir:
        raise ConfigError(what, f"{show(str(p), 200)} is a directory", "give a file path")
    if exists and not found:  # /dev/null, a FIFO, a socket: nothing to read or a hang
        raise ConfigError(what, f"{show(str(p), 200)} is not a regular file",
                          "give a YAML file")
    if not found:
        raise ConfigError(what, f"no such file {show(str(p), 200)}", "check the path")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:  # a binary file, or text in another encoding
        byte = err.object[err.start]
        raise ConfigError(what, f"cannot read {show(str(p), 200)}: byte {byte:#04x} at offset "
                                f"{err.start} is not UTF-8 text",
                          "save it as UTF-8 YAML") from None
    except OSError as err:
        raise ConfigError(what, f"cannot read {str(p)!r} ({err.__class__.__name__})") from None
    try:
        return safe_load_text(text, f"{what} {str(p)!r}")
    except NotYaml:
        if p.suffix.lower() != ".json":
            raise
    return load_json_text(text, f"{what} {str(p)!r}")


def check_schema_version(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Pop and check `schema_version` (absent means the current version)."""
    data = dict(data)
    version = data.pop("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"{where}.schema_version" if where else "schema_version",
            f"got {show(version)}",
            f"this autoplan reads schema_version {SCHEMA_VERSION}",
        )
    return data


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, overwrite: bool = False) -> Path:
    """Write `text` to `path` via a temporary file and rename; refuse to replace unless asked."""
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError("output", f"{show(str(p))} is a directory", "give a file path")
        if p.exists() and not overwrite:
            raise ConfigError(
                "output", f"{show(str(p))} already exists", "choose another path or pass --force"
            )
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    except OSError as err:  # a file where a folder belongs, no write access, a name too long
        raise ConfigError("output", f"cannot write {show(str(p))} ({err.strerror})",
                          "choose another path") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600 files; follow the umask
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def save_yaml(
    data: Any, path: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Save plain data as YAML atomically, then reload and compare with what was meant."""
    text = dump_yaml(data)
    if yaml.safe_load(text) != data:
        raise AssertionError("YAML round trip changed the data")  # internal invariant
    return write_text_atomic(path, text, overwrite=overwrite)
