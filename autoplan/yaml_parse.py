"""Parsing YAML and JSON text into plain data, bounded and strict: no nesting or alias expansion
past the limits, no key written twice, no NaN or numbers of thousands of digits; every refusal
is one ConfigError line. yaml_io reads files through it and builds dataclasses from the result."""

from __future__ import annotations

import json
import reprlib
from typing import Any

import yaml

from autoplan.errors import ConfigError

MAX_YAML_DEPTH = 32
"""Deepest nesting of mappings and lists a YAML/JSON file may have (autoplan's own files: 5)."""
MAX_YAML_NODES = 100_000
"""Most values a YAML file may hold once its aliases are expanded (a profile holds ~500): a
470-byte file of nested aliases would otherwise expand to hundreds of millions."""
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 120
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = 6
_SHOWN.maxlevel = 3


def show(value: Any, limit: int = 200) -> str:
    """repr() of a value for an error message, cut to about `limit` characters."""
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Refused(Exception):
    """A YAML document autoplan refuses to build (too deep, too many values, self-reference)."""


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses documents nested past MAX_YAML_DEPTH or holding more than
    MAX_YAML_NODES values once aliases are expanded, before any Python object is built."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """SafeLoader's mapping, refusing a key written twice in one mapping (PyYAML keeps the
        last silently); keys brought in by a `<<` merge may be overridden, as YAML intends."""
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: SafeLoader names it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {show(key, 80)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expanded_size(root: yaml.Node) -> None:
    """Count values as if every alias were copied (iteratively, memoised per node)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] > MAX_YAML_NODES:
                raise _Refused(
                    f"expands to more than {MAX_YAML_NODES} values (nested aliases?)"
                )
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise _Refused("an alias refers to itself (a recursive structure)")
            if id(child) not in sizes:
                stack.append((child, False))


class NotYaml(ConfigError):
    """Text that YAML cannot parse (safe_load_text), which read_yaml retries as JSON."""


def safe_load_text(text: str, what: str, *, invalid_as_text: bool = False) -> Any:
    """yaml.safe_load through BoundedLoader; every refusal is a one-line ConfigError on `what`.
    `invalid_as_text`: text that is not YAML at all comes back as the string itself."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except _Refused as err:
        raise ConfigError(what, f"refused: {err}", "write the values out plainly") from None
    except yaml.YAMLError as err:
        if invalid_as_text:
            return text
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise NotYaml(what, f"not valid YAML{where}: {problem}") from None
    except ValueError as err:  # int() past sys.get_int_max_str_digits(), bad timestamps
        raise ConfigError(what, f"a value cannot be read ({show(str(err), 120)})") from None
    except RecursionError:  # pragma: no cover - the depth bound comes first
        raise ConfigError(what, f"nested deeper than {MAX_YAML_DEPTH} levels") from None


def check_nesting(data: Any, what: str, max_depth: int = MAX_YAML_DEPTH) -> Any:
    """Refuse plain data (e.g. from JSON) nested deeper than `max_depth`; iterative."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= max_depth:
                raise ConfigError(what, f"nested deeper than {max_depth} levels",
                                  "write the values out plainly")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class _DuplicateKey(ValueError):
    """A JSON object that names one key twice (json.loads keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def load_json_text(text: str, what: str) -> Any:
    """json.loads, strictly: no NaN/Infinity, no numbers of thousands of digits, no nesting
    past MAX_YAML_DEPTH; every problem is a one-line ConfigError on `what`."""
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        raise ConfigError(what, f"duplicate key {show(err.args[0], 80)}",
                          "write each key once") from None
    except json.JSONDecodeError as err:
        raise ConfigError(what, f"not valid JSON ({err.msg} at line {err.lineno}, "
                                f"column {err.colno})") from None
    except RecursionError:
        raise ConfigError(what, f"nested deeper than {MAX_YAML_DEPTH} levels",
                          "write the values out plainly") from None
    except ValueError as err:  # NaN/Infinity, or an integer past the digit limit
        raise ConfigError(what, f"a value cannot be read ({show(str(err), 120)})",
                          "numbers must be finite and of ordinary size") from None
    return check_nesting(data, what)
