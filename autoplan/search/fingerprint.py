"""What a stored search study was made for, and why a request may or may not resume it: the
request's fingerprint (hashes of model, profile and runtime by content), a record of the profile
beside it that names what changed, and the one-line refusal with a fix that works.
optuna_search.py opens the studies.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autoplan.cost.estimate import default_runtime
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import OMITTED_AT_DEFAULT, UNPRICED, ModelSpec
from autoplan.yaml_io import to_dict

if TYPE_CHECKING:
    from autoplan.search.engine import SearchRequest


def content_hash(obj: Any) -> str:
    """SHA-256 of an object's canonical JSON (dataclasses and enums as YAML writes them, keys
    sorted): the same in every process, unlike Python's hash()."""
    return _sha256(to_dict(obj))


def _sha256(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


PROFILE_OMITTED_AT_DEFAULT = {"attention_head_dims": None, "attention_clock": 1.0,
                              "tp_collective_overhead_s": 0.0, "fp8_matmul": 1.0,
                              "nvls_all_reduce": None}
"""Efficiency fields added after studies were stored, left out of profile_hash at their
default: a profile that leaves them so hashes as before they existed, so its studies resume;
one that sets them prices differently and does not."""


def _profile_data(profile: ClusterProfile) -> dict[str, Any]:
    """The profile as profile_hash hashes it: PROFILE_OMITTED_AT_DEFAULT fields at their
    default left out."""
    data = to_dict(profile)
    for name, default in PROFILE_OMITTED_AT_DEFAULT.items():
        if data["efficiency"].get(name, default) == default:
            data["efficiency"].pop(name, None)
    return data


def profile_hash(profile: ClusterProfile) -> str:
    """content_hash of a profile, PROFILE_OMITTED_AT_DEFAULT fields at their default left out."""
    return _sha256(_profile_data(profile))


RUNTIME_OMITTED_AT_DEFAULT = ("has_sequence_parallel", "fused_attention", "grad_accumulate_bytes",
                              "train_metric_passes")
"""RuntimeTraits fields added after studies were stored, left out of runtime_hash at their
default: a runtime they leave as it was hashes as before them, so its studies resume; one they
change (megatron-2021 without sequence parallelism) prices otherwise and does not."""


def runtime_hash(traits: RuntimeTraits) -> str:
    """content_hash of runtime traits, RUNTIME_OMITTED_AT_DEFAULT fields at their default left
    out."""
    data = to_dict(traits)
    for name in RUNTIME_OMITTED_AT_DEFAULT:
        if data.get(name) == RuntimeTraits.__dataclass_fields__[name].default:
            data.pop(name, None)
    return _sha256(data)


def model_hash(model: ModelSpec) -> str:
    """content_hash of a model without its RoPE base, scaling and norms' epsilon (later fields
    no cost depends on) and without qkv_bias and qk_norm at their defaults, so a tune's study
    of a model resumes as before them."""
    return _sha256(_costed_model(to_dict(model)))


def _costed_model(data: dict[str, Any]) -> dict[str, Any]:
    """A model mapping without the fields that came after studies were first stored
    (model_spec.OMITTED_AT_DEFAULT): those no figure depends on (UNPRICED: the RoPE base and
    scaling, the norms' epsilon) whatever their value, the others (qkv_bias, qk_norm) at their
    defaults only."""
    return {k: v for k, v in data.items() if k not in OMITTED_AT_DEFAULT
            or (k not in UNPRICED and v != OMITTED_AT_DEFAULT[k])}


def fingerprint(req: SearchRequest, sampler: str) -> str:
    """Everything the stored records depend on: a study resumes only under the same request.
    The profile and the runtime traits are hashed by content, so a recalibrated or edited
    profile under the same name (or path) does not mix its results with the old ones, and one
    profile named by name or by path resumes the same study."""
    runtime = req.runtime or default_runtime(req.profile)
    fields: dict[str, Any] = {
        "model": req.model, "gpu_counts": req.gpu_counts,
        "profile_sha256": profile_hash(req.profile),
        "global_batch_size": req.global_batch_size, "space": req.space.summary(),
        "targets": req.targets, "sampler": sampler, "seed": req.seed,
        "runtime": runtime.name, "runtime_sha256": runtime_hash(runtime),
    }
    if req.global_batch_size_max is not None:
        fields["global_batch_size_max"] = req.global_batch_size_max
    out = to_dict(fields)
    if req.targets.memory_slack == "median":  # the default, as before the flag: old studies resume
        out["targets"].pop("memory_slack", None)
    if isinstance(out["model"], dict):  # unpriced fields, and priced ones at default: old studies resume
        out["model"] = _costed_model(out["model"])
    return json.dumps(out, sort_keys=True, default=str)


# --- the profile beside the fingerprint ---------------------------------------------------

PROFILE_ATTR = "autoplan_profile"
"""Study user attribute beside the fingerprint: the profile's name, the --cluster reference
that gave it, and each top-level field (numbers as they are, the rest hashed), so a refusal
names what changed where the fingerprint holds only the whole profile's hash. Studies stored
before it have none (their refusal says "another profile")."""
UNPRICED_REQUEST_FIELDS = ("space.description",)
"""Fingerprint fields no stored trial depends on, beside the profile's: a space whose one-line
description was reworded resumes its study, as a profile's does."""
UNPRICED_PROFILE_FIELDS = ("price_per_gpu_hour", "description")
"""Profile fields no stored record depends on: a trial stores GPU-hours, never dollars (the
price multiplies them when the study is read: engine.with_cluster), and the description is
prose. A profile that changed only in them resumes its study."""


def profile_record(profile: ClusterProfile, ref: str) -> dict[str, Any]:
    """The PROFILE_ATTR value of a profile given as `ref` (--cluster's name or path)."""
    fields = {k: v if v is None or isinstance(v, (bool, int, float)) else _sha256(v)[:16]
              for k, v in _profile_data(profile).items() if k != "name"}
    return {"name": profile.name, "ref": ref, "fields": fields}


@dataclass(frozen=True)
class Stored:
    """What a study holds of the request that made it."""

    fingerprint: str
    profile: dict[str, Any] | None = None
    """Its PROFILE_ATTR (None: stored before it)."""


def _profile_words(typed: Any, record: Any, given: dict[str, Any]) -> str | None:
    """The profile change in words (None: it changed only in fields no record depends on):
    the stored profile's name -> the new one, or which of its fields changed. `typed`: the
    profile as the first stored studies' fingerprints held it typed (None in later ones)."""
    name = given["name"]
    if not isinstance(record, dict) or not isinstance(record.get("fields"), dict):
        if isinstance(typed, str) and typed not in (given["ref"], name):
            return f"--cluster {typed} -> {given['ref']}"
        if isinstance(typed, str):
            return f"profile {name}'s contents changed"
        # a study made before the profile record: which fields (price among them) is unknown
        return f"--cluster another profile, or new contents or price -> {name}"
    if record.get("name") != name:
        return f"--cluster {record.get('name')} -> {name}"
    before, after = record["fields"], given["fields"]
    differ = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    if not differ:  # the same fields, yet another hash: a field this autoplan does not record
        return f"profile {name}'s contents changed"
    if all(k in UNPRICED_PROFILE_FIELDS for k in differ):
        return None
    return f"profile {name}'s contents changed: " + ", ".join(
        f"{k} {_scalar(before.get(k))} -> {_scalar(after.get(k))}"
        if _is_scalar(before.get(k)) and _is_scalar(after.get(k)) else k for k in differ)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float))


def _scalar(value: Any) -> str:
    return "none" if value is None else json.dumps(value)


def request_changes(stored: Stored | str, given: str,
                    profile: dict[str, Any] | None = None) -> list[str]:
    """`FIELD stored -> given` for each field of two fingerprints that differs ([] when the
    same request, or when the profile changed only in fields no record depends on). The
    profile's change is put in words from the study's profile record and `profile` (this
    request's profile_record). Fingerprints stored before the profile was compared by content
    alone also hold the profile as typed ("profile"): it is left out wherever its hash is
    there."""
    if isinstance(stored, str):
        stored = Stored(stored)
    if stored.fingerprint == given:
        return []
    try:
        old, new = json.loads(stored.fingerprint), json.loads(given)
    except ValueError:
        old = new = None
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["another request"]
    typed = old.pop("profile", None) if "profile_sha256" in old else None
    old, new = _flat(old), _flat(new)
    for flat in (old, new):  # the default the fingerprint leaves out (fingerprint())
        if "targets.objectives" in flat:
            flat.setdefault("targets.memory_slack", "median")
    out = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) == new.get(k) or k in UNPRICED_REQUEST_FIELDS:
            continue
        if k == "profile_sha256" and profile is not None:
            words = _profile_words(typed, stored.profile, profile)
            if words is not None:
                out.append(words)
            continue
        out.append(f"{_field_name(k)} {_shown(k, old.get(k))} -> {_shown(k, new.get(k))}")
    return out


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested fields as dotted keys (targets.max_step_time_s), so a change names its leaf."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if isinstance(v, dict) and v:
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _field_name(key: str) -> str:
    return {"profile_sha256": "profile contents", "runtime_sha256": "runtime traits",
            "gpu_counts": "--num-gpus", "global_batch_size": "--global-batch-size"}.get(key, key)


def _shown(key: str, value: Any) -> str:
    """A fingerprint value short enough for one line (hashes to 12 digits, the rest to 40)."""
    if value is None:
        return "none"
    text = value[:12] if key.endswith("_sha256") else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the refusal --------------------------------------------------------------------------

AUTO_KNOBS = (
    # the same command settles `precision: auto` otherwise than when the study was made
    # (several GPU types once searched only the formats every type has)
    ("precision", "auto now settles as shown"),
    # `attention: auto` (session 35) settles to eager where the runtime runs no fused kernel on
    # the GPU (Megatron on a V100): the study's flash plans do not run there
    ("attention", "auto now settles to what the runtime runs on the GPU"),
)


def mismatch(name: str | None, changes: list[str], auto_precision: bool = False,
             auto_attention: bool = False, cluster: str | None = None) -> ConfigError:
    """The refusal of a study made by another request, naming up to three changes. Its fix
    names one thing to change only where that alone resumes the study: the space's precision
    or attention list (the only change, from `auto`), or `cluster` (the study's profile,
    checked by the caller to give back its fingerprint); else the general one."""
    shown = "; ".join(changes[:3]) + (f"; {len(changes) - 3} more" if len(changes) > 3 else "")
    fix = "rerun that exact command, or use another --study name"
    auto = {"precision": auto_precision, "attention": auto_attention}
    if changes and all(_profile_change(c) for c in changes):
        # the command may be the very one that made the study: its profile is what changed
        fix = ("the profile changed since the study was made: restore it to resume, or use "
               "another --study name")
    if cluster is not None:
        fix = f"to resume, give --cluster {cluster} (the study's profile), or use another " \
              "--study name"
    elif len(changes) == 1:
        for knob, why in AUTO_KNOBS:
            if auto[knob] and changes[0].startswith(f"space.{knob} "):
                was = changes[0].split(" -> ")[0].removeprefix(f"space.{knob} ")
                fix = (f"{knob}: {why}; to resume, give a space that lists the study's {knob} "
                       f"({was}), or use another --study name")
    return ConfigError("--study", f"{name!r} was created by a different search ({shown})", fix)


def cluster_that_resumes(req: SearchRequest, sampler: str, stored: Stored) -> str | None:
    """The --cluster reference the study was made with, where giving it instead (and nothing
    else) fingerprints as the study does: its profile still loads as it was then. None where
    no such reference is known or it would not resume (one study per type of --cluster A,B
    is named after its type, so another type is another study)."""
    from autoplan.hardware import load_profile

    record = stored.profile or {}
    ref = record.get("ref")
    if not isinstance(ref, str) or ref == req.profile_ref or (
            req.study or "").endswith(f"/{req.profile_ref}"):
        return None
    try:
        alt = replace(req, profile=load_profile(ref), profile_ref=ref,
                      space=req.space_given or req.space)
    except ConfigError:  # the profile is gone or no longer loads
        return None
    # what resume compares: a price or description of its own does not stop it
    return ref if not request_changes(stored, fingerprint(alt, sampler),
                                      profile_record(alt.profile, ref)) else None


def _profile_change(change: str) -> bool:
    """Whether a request_changes line is about the profile alone (_profile_words' wording)."""
    return change.startswith(("profile ", "--cluster "))
