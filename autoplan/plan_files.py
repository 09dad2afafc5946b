"""A plan as a file: the mapping a saved plan holds (plan_to_dict leaves out fields at their
defaults so older plans read as before), its identity, the model and files it names, and loading
and saving, with relative paths read from the plan's folder. Apart from plan.py, which holds the
plan's types and their strict loader from a mapping: the file format's compatibility rules and
paths are a concern of their own, shared by every command that reads or writes a plan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, ModelSpec, model_dict
from autoplan.moe_spec import moe_dict
from autoplan.plan import Plan, RecomputeMethod, plan_from_dict
from autoplan.yaml_io import SCHEMA_VERSION, read_yaml, save_yaml, to_dict


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    out.update(to_dict(plan))
    if out.get("predicted") is None:
        out.pop("predicted")
    if out["pipeline"].get("layers_per_stage") is None:
        out["pipeline"].pop("layers_per_stage")
    if out["recompute"].get("method") == RecomputeMethod.BLOCK.value:  # plans read as before
        out["recompute"].pop("method")
    if out["recompute"].get("modules") is None:
        out["recompute"].pop("modules")
    if isinstance(out["model"], dict):  # a dense inline model reads as before MoE existed
        for key in ("moe", "mla"):
            if out["model"].get(key) is None:
                out["model"].pop(key, None)
        if out["model"].get("mtp_layers") == 0:  # models without MTP read as before
            out["model"].pop("mtp_layers")
        out["model"] = model_dict(out["model"])  # rope_theta at its default reads as before
        if "moe" in out["model"]:  # routing fields at their defaults read as before
            out["model"]["moe"] = moe_dict(out["model"]["moe"])
    for key in ("ep", "etp"):  # plans without expert parallelism read as before
        if out["parallel"].get(key) == 1:
            out["parallel"].pop(key)
    if out["parallel"].get("dp_shard") is None:  # plans without HSDP read as before
        out["parallel"].pop("dp_shard", None)
    if out.get("grad_reduce_dtype") is None:  # the runtime's default reads as before
        out.pop("grad_reduce_dtype", None)
    return out


def plan_model_ref(ref: Any, spec: ModelSpec) -> str | ModelSpec:
    """The model as a written plan names it: a preset name as given (when `spec` is that
    preset, not one at another --seq-len), anything else inline (a model file, a Hugging Face
    folder), so the plan reads the same from any folder. Search and import write plans so."""
    return ref if isinstance(ref, str) and PRESETS.get(ref) == spec else spec


def plan_identity(plan: Plan) -> str:
    """A plan as trained, less what it was predicted at, as canonical JSON: plans with equal
    identities train the same way (calibrate counts distinct plans by it; tune keys trials by
    its hash)."""
    return json.dumps(plan_to_dict(plan.replace(predicted=None)), sort_keys=True, default=str)


def plan_file_paths(data: dict[str, Any], plan_file: str | Path) -> dict[str, Any]:
    """`data`, a plan file's mapping, with the files it names by a relative path (`model`,
    `cluster.profile`) made absolute from the plan's folder: one rule for every command that
    reads a plan file (estimate --plan, train, export, the job export writes), whatever folder
    it runs in. Names (a model preset, a profile name) and absolute paths stay as written, a
    `~` path is expanded to the home folder; a bare word that is no preset is a path only
    where the plan's folder holds it. What is no string is left for the strict loader to
    name."""
    folder = Path(plan_file).resolve().parent
    out = dict(data)
    model = out.get("model")
    if isinstance(model, str) and model and model not in PRESETS:
        path = Path(model)
        if model.startswith("~"):  # a home folder: no shell expands it inside a YAML file
            out["model"] = str(path.expanduser())
        elif not path.is_absolute() and (
                not _bare_word(model) or _exists(folder / path)):
            out["model"] = _from(folder, path)
    cluster = out.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("profile"), str):
        ref = cluster["profile"]
        if ref.startswith("~"):
            out["cluster"] = {**cluster, "profile": str(Path(ref).expanduser())}
        elif ref and not resources.is_name(ref) and not Path(ref).is_absolute():
            out["cluster"] = {**cluster, "profile": _from(folder, Path(ref))}
    return out


def _bare_word(ref: str) -> bool:
    """A reference without a folder part or a model file's suffix: a preset's name, misspelt
    or not (`llama-3.1-8bb`, whose dots are no suffix), unless the plan's folder holds it."""
    return "/" not in ref and os.sep not in ref and not ref.endswith(MODEL_FILE_SUFFIXES)


MODEL_FILE_SUFFIXES = (".yaml", ".yml", ".json")
"""What a model file a plan names ends in (model_spec.load_model reads these)."""


def _from(folder: Path, path: Path) -> str:
    """`path` read from `folder` (resolved, so each leading `..` is its parent, as the system
    reads it), as one absolute path to show in messages."""
    parts = path.parts
    while parts and parts[0] in ("..", "."):
        folder = folder.parent if parts[0] == ".." else folder
        parts = parts[1:]
    return str(folder.joinpath(*parts))


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name past NAME_MAX is no file
        return False


def load_plan(path: str | Path) -> Plan:
    """The plan in the file at `path`; its relative paths are read from its folder
    (plan_file_paths)."""
    data = read_yaml(path, "PLAN")
    if not isinstance(data, dict):
        raise ConfigError(f"PLAN {path}", "expected a mapping of plan fields")
    return plan_from_dict(plan_file_paths(data, path))


def save_plan(plan: Plan, path: str | Path, *, overwrite: bool = False) -> Path:
    data = plan_to_dict(plan)
    written = save_yaml(data, path, overwrite=overwrite)
    # every save reloads and compares: a relative path as load_plan reads it, from the folder
    if load_plan(written) != plan_from_dict(plan_file_paths(data, written)):
        raise AssertionError(f"plan written to {written} does not reload equal")
    return written
