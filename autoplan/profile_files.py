"""Profile files: which profiles exist (the user's folder, then the shipped ones), the file a
name refers to, what a YAML file in a profile folder is when it is no profile, and the --out and
--name a profile is written under. hardware.py reads and checks the file itself."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.yaml_io import name_hint, read_yaml, show


def available_profiles() -> list[str]:
    """Profile names: the user's directory and the built-in ones."""
    return resources.names(resources.PROFILES)


def profile_names() -> list[str]:
    """The names of available_profiles() that are profiles: less the plans, model specs and
    runtime-traits files kept beside them (not_a_profile), which `autoplan clusters` skips
    and --cluster's "choose one of" leaves out. A broken profile stays: it is one."""
    return [name for name in available_profiles()
            if (path := resources.find(resources.PROFILES, name)) is None
            or not_a_profile(path) is None]


@functools.cache
def other_files() -> tuple[tuple[str, frozenset[str]], ...]:
    """The other YAML files autoplan reads, by keys no profile holds (in this order: a plan's
    `offload:` is a traits key too)."""
    import dataclasses

    from autoplan.cost.runtimes import RuntimeTraits

    traits = frozenset(f.name for f in dataclasses.fields(RuntimeTraits)) - {"name",
                                                                              "description"}
    return (("a plan", frozenset({"model", "cluster", "batch", "parallel"})),
            ("a model spec", frozenset({"num_layers", "hidden_size", "num_heads", "vocab_size"})),
            ("runtime traits, for --runtime", traits))


def not_a_profile(path: str | Path) -> str | None:
    """What a YAML file in a profile folder is when it is no profile (no `device:`) but one
    of the other files autoplan reads (other_files: a runtime-traits file has `base:` or a
    traits key); None for anything else, a broken profile, which is said as one."""
    try:
        data = read_yaml(path, "profile")
    except ConfigError:
        return None
    if not isinstance(data, dict) or "device" in data:
        return None
    return next((what for what, keys in other_files() if not keys.isdisjoint(data)), None)


def check_out_and_name(out: str | None, name: str | None, reader: str = "--cluster") -> None:
    """Refuse an empty --out or --name (`--out ''` wrote into the default folder) and an --out
    of a profile that `reader` (`--cluster`, `--profile`) could not read back: without a
    .yaml/.yml suffix a bare word is taken for a packaged profile name. `autoplan profile` and
    `autoplan calibrate` write profiles under this rule."""
    if name is not None and not name.strip():
        raise ConfigError("--name", "is empty", "give the profile a name, or leave --name out")
    if out is None:
        return
    if not out.strip():
        raise ConfigError("--out", "is empty", "give a path ending in .yaml, or leave --out out")
    if Path(out).suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError("--out", f"{show(out)} does not end in .yaml or .yml",
                          f"add .yaml: profiles are YAML files, and `{reader}` reads a bare "
                          "word as the name of a packaged profile")


def profile_path(ref: str | Path, flag: str = "--cluster") -> Path:
    """The file a profile reference names: a name is looked up in the user's profile directory,
    then the built-in ones, and refused with `flag` when neither holds it; anything else is a
    path."""
    if not resources.is_name(ref):
        return Path(ref)
    named = resources.find(resources.PROFILES, str(ref))
    if named is None:
        known = profile_names()
        hint = _named_inside(str(ref)) or name_hint(str(ref), known)
        raise ConfigError(
            flag, f"unknown profile {show(str(ref))}",
            (f"{hint} " if hint else "")
            + f"choose one of {', '.join(known)} or a path to a profile YAML "
            f"({_looked_in()}; make one by running `autoplan profile --name "
            f"{ref if re.fullmatch(r'[A-Za-z0-9._-]+', str(ref)) else show(str(ref))}` on "
            "the machine, or copy a shipped one there and edit it)",
        )
    return named


def _looked_in() -> str:
    """Where a profile name is looked up, for the unknown-profile line: the user's folder (and
    the variable that moves it), then the shipped ones."""
    return (f"looked in {resources.user_dir(resources.PROFILES)} (${resources.PROFILES.env} "
            "sets another folder), then the shipped ones")


_NAME_LINE = re.compile(r"^name:[ \t]*(['\"]?)([^'\"#\s]+)\1[ \t]*(?:#.*)?$", re.MULTILINE)
"""A profile file's top-level `name:` line, read without parsing the file (a hint only)."""


def _named_inside(name: str) -> str | None:
    """'did you mean ...?' for an unknown profile name that a profile file gives as its own
    `name:`: profiles are found by file name (`--cluster my-h100` reads my-h100.yaml), not by
    the name inside, so a user who named the profile in the file looked it up by that."""
    for folder in resources.search_dirs(resources.PROFILES):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            try:
                text = path.read_text(encoding="utf-8", errors="replace")[:100_000]
            except OSError:
                continue
            found = _NAME_LINE.search(text)
            if found and found.group(2) == name and resources.find(
                    resources.PROFILES, path.stem) == path and not_a_profile(path) is None:
                return (f"did you mean {path.stem!r}? {path} says name: {name}, but a profile "
                        "is found by its file name;")
    return None
