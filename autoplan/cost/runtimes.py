"""Runtime traits by name: a preset, a YAML file of RuntimeTraits fields loaded strictly, or
autoplan's own runtime on the profile's device. The spec, its kinds and presets live in
runtime_traits.py, runtime_kinds.py and runtime_presets.py; importers may take them from here."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoplan.cost.runtime_kinds import (
    ATTENTION_KERNELS,
    CP_EXCHANGES,
    EP_DISPATCHERS,
    LOSS_CAST_BYTES,
    OFFLOAD_MODES,
    TP_OVERLAP_METHODS,
    PipelineGradSync,
    SelectiveKind,
)
from autoplan.cost.runtime_presets import RUNTIME_PRESETS, RUNTIMES
from autoplan.cost.runtime_traits import RuntimeTraits
from autoplan.errors import ConfigError
from autoplan.yaml_io import check_schema_version, from_dict, name_hint, read_yaml, show

__all__ = [
    "ATTENTION_KERNELS", "CP_EXCHANGES", "EP_DISPATCHERS", "LOSS_CAST_BYTES", "OFFLOAD_MODES",
    "RUNTIMES", "RUNTIME_PRESETS", "TP_OVERLAP_METHODS", "PipelineGradSync", "RuntimeTraits",
    "SelectiveKind", "load_runtime", "runtime_from_dict",
]


def runtime_from_dict(data: Any, where: str = "runtime", source: str | None = None
                      ) -> RuntimeTraits:
    """RuntimeTraits from a mapping of its fields; `base: <preset>` starts from that preset's
    fields, which the mapping's own then override (e.g. megatron with bf16 gradients). Without a
    `name` the traits take the preset's, or `<base>+<source>` where they come from a file
    (`source`: its stem), so a customised file is never labelled as the untouched preset."""
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {data!r}", "expected a mapping of runtime-traits fields")
    data = dict(check_schema_version(data, where))
    if "base" in data:
        base = data.pop("base")
        # a list or mapping is unhashable: check it is a name before looking it up
        if not isinstance(base, str) or base not in RUNTIME_PRESETS:
            raise ConfigError(f"{where}.base",
                              f"unknown preset {base!r}" if isinstance(base, str)
                              else f"got {show(base)}",
                              f"choose one of {', '.join(RUNTIMES)}")
        name = base if source is None else f"{base}+{source}"
        data = {"name": name, **RUNTIME_PRESETS[base], **data, "base": base}
    try:
        return from_dict(RuntimeTraits, data, "runtime")
    except ConfigError as err:
        # the field checks name `runtime.<field>`: said under `where` once (`--runtime.<field>`)
        if where == "runtime" or not err.field.startswith("runtime"):
            raise
        raise ConfigError(where + err.field[len("runtime"):], err.problem, err.fix) from None


def _names_a_file(ref: str) -> bool:
    """A --runtime value meant as a file (a path separator, a .yaml/.yml suffix in any case, or
    something there by that name), so that a missing or unreadable one is reported as such and
    not as an unknown preset."""
    if "/" in ref or os.sep in ref or Path(ref).suffix.lower() in (".yaml", ".yml"):
        return True
    try:
        return Path(ref).exists()
    except OSError:  # a name past NAME_MAX: no file, so an unknown preset
        return False


def load_runtime(ref: str | Path | RuntimeTraits | None, flag: str = "--runtime",
                 on_cpu: bool = False) -> RuntimeTraits:
    """A preset by name (see RUNTIMES), a YAML file of RuntimeTraits fields, or the default:
    autoplan's own runtime on the profile's kind of device (`on_cpu`; `autoplan` alike)."""
    if isinstance(ref, RuntimeTraits):
        return ref
    if ref is None or ref == "autoplan":
        ref = "autoplan-cpu" if on_cpu else "autoplan-cuda"
    name = str(ref)
    if name in RUNTIME_PRESETS:
        return runtime_from_dict({"schema_version": 1, "name": name, **RUNTIME_PRESETS[name]}, flag)
    if not _names_a_file(name):
        hint = name_hint(name, ["autoplan", *RUNTIMES])
        raise ConfigError(flag, f"unknown runtime {name!r}", (f"{hint} " if hint else "")
                          + f"choose one of autoplan, {', '.join(RUNTIMES)} or a path to a "
                          "traits YAML")
    path = Path(name)
    traits = runtime_from_dict(read_yaml(path, flag), flag, source=path.stem)
    # a file that calls itself a preset must be that preset, or its estimates read as the preset's
    if traits.name in RUNTIME_PRESETS and replace(traits, base=None) != load_runtime(traits.name):
        raise ConfigError(f"{flag}.name", f"got {traits.name!r}, a preset these traits differ "
                          "from", "choose a name of your own, or leave name out to be called "
                          "<base>+<file stem>")
    return traits
