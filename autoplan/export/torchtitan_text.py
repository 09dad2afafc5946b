"""Text of the torchtitan export: a TOML job file (<= 0.2.2) or a config_registry module (>= 0.3).

Both are written from the same section -> field -> value mapping built in `torchtitan.py`.
"""

from __future__ import annotations

import json
import pprint
import shlex
from pathlib import Path
from typing import Any

from autoplan.export.base import Layout
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan

MODULE = "autoplan_torchtitan"
FUNCTION = "autoplan_plan"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")  # programming error


def module_name(out: str | None) -> tuple[str, str]:
    """(PYTHONPATH, module) under which torchtitan imports the file written at `out`."""
    if out is None:
        return ".", MODULE
    path = Path(out)
    return shlex.quote(str(path.parent)), path.stem


def _torchrun(lay: Layout) -> str:
    if lay.num_nodes == 1:
        return f"torchrun --standalone --nproc-per-node={lay.nproc_per_node}"
    return (
        f"torchrun --nnodes={lay.num_nodes} --nproc-per-node={lay.nproc_per_node} "
        "--rdzv-backend=c10d --rdzv-endpoint=$RDZV_HOST:29500"
    )


def toml_text(plan: Plan, model: ModelSpec, values: dict[str, dict[str, Any]], lay: Layout,
              out: str | None = None) -> str:
    config_file = shlex.quote(out) if out else "torchtitan.toml"
    lines = [
        f"# torchtitan (<= 0.2.2) job for model {model.name}, written by "
        "`autoplan export --to torchtitan --torchtitan-format toml`.",
        f"# Run: {_torchrun(lay)} -m torchtitan.train --job.config_file {config_file}",
        "# Data, tokenizer, optimizer and step count keep torchtitan's defaults: add them here.",
        "",
        "[job]",
        f"description = {_toml_value('autoplan plan for ' + model.name)}",
    ]
    for section in ("model", "training", "parallelism", "activation_checkpoint"):
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in values[section].items()]
    return "\n".join(lines) + "\n"


AC_CLASSES = {"full": "FullAC", "selective": "SelectiveAC"}
"""activation_checkpoint.mode -> torchtitan >= 0.3's config class
(torchtitan.distributed.activation_checkpoint)."""


def python_text(
    model: ModelSpec, values: dict[str, dict[str, Any]], found: tuple[str, str], lay: Layout,
    out: str | None = None, moe_lines: tuple[list[str], list[str]] | None = None,
) -> str:
    """The config_registry module. `found` is (flavor, config_registry function); a MoE model
    passes `moe_lines` (imports, body lines setting config.model_spec; torchtitan_moe.py) in
    place of the Llama 3 ones."""
    flavor, base = found
    if moe_lines is None:
        start = base if base in ("llama3_8b", "llama3_70b", "llama3_405b") else "llama3_8b"
        imports = ["from torchtitan.models.llama3 import config_registry, model_registry"]
        spec = [f"    config.model_spec = model_registry({flavor!r})"]
    else:
        start, (imports, spec) = base, moe_lines
    ac = values["activation_checkpoint"]["mode"]
    pythonpath, module = module_name(out)
    saved = "" if out else f" (save this file as {MODULE}.py)"
    lines = [
        f'"""torchtitan (>= 0.3) config for model {model.name}, written by `autoplan export`.',
        "",
        f"Run{saved}: PYTHONPATH={pythonpath} {_torchrun(lay)} -m torchtitan.train "
        f"--module {module} --config {FUNCTION}",
        "Data, tokenizer, optimizer and step count come from the base config: change them here.",
        '"""',
        "",
        *([f"from torchtitan.distributed.activation_checkpoint import {AC_CLASSES[ac]}"]
          if ac in AC_CLASSES else []),
        *sorted(imports),
        "",
        "",
        f"def {FUNCTION}():",
        f"    config = config_registry.{start}()",
        *spec,
    ]
    for section in ("training", "parallelism"):
        for key, value in values[section].items():
            text = pprint.pformat(value, width=80, compact=True).replace("\n", "\n        ")
            lines.append(f"    config.{section}.{key} = {text}")
    if ac in AC_CLASSES:  # selective: op-level SAC (SelectiveAC's default save list)
        lines.append(f"    config.activation_checkpoint = {AC_CLASSES[ac]}.Config()")
    else:
        lines.append("    config.activation_checkpoint = None")
    lines.append("    return config")
    return "\n".join(lines) + "\n"
