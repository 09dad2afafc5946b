"""Read an existing DeepSpeed JSON config or Megatron-LM argument list into a Plan, so that
`autoplan estimate` can score it (and a search can compare it with the best plan it finds).

Each reader builds a plan mapping; `finish_plan` applies --set edits, loads it strictly and checks
it with the same rules as every other plan. Settings autoplan cannot represent are errors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.plan import Plan, plan_from_dict, set_field


def _read(path: str | Path, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(what, f"no such file {str(p)!r}", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(what, f"cannot read {str(p)!r} ({err.__class__.__name__})") from None


def _exact(n: int, d: int, what: str, fix: str) -> int:
    if d <= 0 or n % d:
        raise ConfigError(what, f"{n} is not a multiple of {d}", fix)
    return n // d


def _require_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(where, f"got {value!r}", "expected a positive integer")
    return value


def finish_plan(data: dict[str, Any], assignments: list[str], what: str) -> Plan:
    """--set edits, strict loading, then the plan rules (imported from autoplan.plan_rules)."""
    for assignment in assignments:
        set_field(data, assignment)
    plan = plan_from_dict(data)
    from autoplan.hardware import cluster
    from autoplan.plan_rules import validate_plan

    reasons = validate_plan(plan, plan.model_spec(), cluster(plan.cluster.profile, plan.world_size))
    if reasons:
        raise ConfigError(what, "the imported plan is not valid: " + "; ".join(reasons))
    return plan


# ---- DeepSpeed ---------------------------------------------------------------------------------


def _offload(section: Any, where: str) -> bool:
    if not isinstance(section, dict):
        return False
    device = section.get("device", "none")
    if device == "nvme":
        raise ConfigError(where, "device nvme", "autoplan models offload to CPU memory only")
    if device not in ("cpu", "none", None):
        raise ConfigError(where, f"device {device!r}", "expected cpu or none")
    return device == "cpu"


def _enabled(cfg: dict[str, Any], *keys: str) -> bool:
    for key in keys:
        section = cfg.get(key)
        if isinstance(section, dict):
            flag = section.get("enabled", False)
            if flag == "auto":
                raise ConfigError(f"{key}.enabled", "is 'auto'", "resolve it to true or false")
            if flag:
                return True
    return False


def deepspeed_plan_dict(cfg: dict[str, Any], num_gpus: int | None, what: str) -> dict[str, Any]:
    """Plan fields a DeepSpeed config determines (model and cluster come from the caller)."""
    tp = _require_int((cfg.get("tensor_parallel") or {}).get("autotp_size", 0) or 1, "autotp_size")
    stages = (cfg.get("pipeline") or {}).get("stages", "auto")
    pp = 1 if stages == "auto" else _require_int(stages, f"{what} pipeline.stages")
    if (cfg.get("sequence_parallel_size") or 1) > 1:
        raise ConfigError(
            f"{what} sequence_parallel_size",
            "Ulysses sequence parallelism",
            "autoplan plans ring context parallelism (cp), not Ulysses",
        )
    raw = {
        k: cfg.get(k)
        for k in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
    }
    for key, value in raw.items():
        if value == "auto":
            raise ConfigError(f"{what} {key}", "is 'auto'", "resolve it to a number")
        if value is not None:
            _require_int(value, f"{what} {key}")
    gbs: int | None = raw["train_batch_size"]
    mb: int | None = raw["train_micro_batch_size_per_gpu"]
    gas: int | None = raw["gradient_accumulation_steps"]
    if num_gpus is not None:
        dp = _exact(
            num_gpus, tp * pp, "--num-gpus", "it must be a multiple of autotp_size * stages"
        )
    elif gbs is not None and mb is not None and gas is not None:
        dp = _exact(
            gbs,
            mb * gas,
            f"{what} train_batch_size",
            "it must equal micro batch * accumulation * dp",
        )
    else:
        raise ConfigError("--num-gpus", "missing", "the config does not fix the data-parallel size")
    if mb is None:
        if gbs is None:
            raise ConfigError(
                what,
                "no train_batch_size or train_micro_batch_size_per_gpu",
                "DeepSpeed needs at least one of them",
            )
        mb = _exact(gbs, (gas or 1) * dp, f"{what} train_batch_size", "check the batch keys")
    if gbs is None:
        gbs = mb * (gas or 1) * dp
    if gas is not None and gbs != mb * gas * dp:
        raise ConfigError(
            f"{what} train_batch_size",
            f"{gbs} != {mb} * {gas} * dp {dp}",
            "DeepSpeed requires train_batch_size = micro * accumulation * dp",
        )
    zero = cfg.get("zero_optimization") or {}
    checkpointing = "activation_checkpointing" in cfg or (cfg.get("pipeline") or {}).get(
        "activation_checkpoint_interval", 0
    )
    return {
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": 1},
        "batch": {"micro_batch_size": mb, "global_batch_size": gbs},
        "zero_stage": int(zero.get("stage", 0)),
        "offload": {
            "optimizer": _offload(zero.get("offload_optimizer"), "offload_optimizer"),
            "params": _offload(zero.get("offload_param"), "offload_param"),
        },
        "recompute": {"policy": "full" if checkpointing else "none"},
        "precision": "bf16"
        if _enabled(cfg, "bf16", "bfloat16")
        else "fp16"
        if _enabled(cfg, "fp16")
        else "fp32",
    }


def import_deepspeed(
    path: str | Path,
    *,
    model: str | None,
    cluster: str,
    num_gpus: int | None,
    assignments: Sequence[str] = (),
) -> Plan:
    what = f"deepspeed config {path}"
    try:
        cfg = json.loads(_read(path, "FILE"))
    except json.JSONDecodeError as err:
        raise ConfigError(what, f"not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(what, "expected a JSON object")
    if model is None:
        raise ConfigError("--model", "missing", "a DeepSpeed config names no model; pass --model")
    data = deepspeed_plan_dict(cfg, num_gpus, what)
    data["model"] = model
    data["cluster"] = {
        "profile": cluster,
        "num_gpus": data["parallel"]["dp"] * data["parallel"]["tp"] * data["parallel"]["pp"],
    }
    return finish_plan(data, list(assignments), what)


# ---- Megatron-LM ------------------------------------------------------------------------------


def import_megatron(
    path: str | Path,
    *,
    model: str | None,
    cluster: str,
    num_gpus: int | None,
    assignments: Sequence[str] = (),
) -> Plan:
    from autoplan.export.megatron_import import megatron_plan_dict

    what = f"megatron arguments {path}"
    data = megatron_plan_dict(_read(path, "FILE"), model, num_gpus, what)
    data["cluster"]["profile"] = cluster
    return finish_plan(data, list(assignments), what)


IMPORTERS = {"deepspeed": import_deepspeed, "megatron": import_megatron}
