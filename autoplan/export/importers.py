"""`autoplan import`: a DeepSpeed JSON (deepspeed_import) or Megatron-LM arguments
(megatron_import) read into a Plan for `autoplan estimate` to score; `finish_plan` applies --set
edits, loads it strictly and checks it with every plan's rules."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.deepspeed_import import deepspeed_plan_dict, require_int
from autoplan.hardware import load_profile
from autoplan.hardware_devices import DeviceSpec
from autoplan.plan import Plan, plan_from_dict
from autoplan.yaml_io import show
from autoplan.yaml_parse import load_json_text

log = logging.getLogger(__name__)


def _read(path: str | Path, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(what, f"no such file {str(p)!r}", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(what, f"cannot read {str(p)!r} ({err.__class__.__name__})") from None


def finish_plan(data: dict[str, Any], assignments: list[str], what: str) -> Plan:
    """--set edits (as estimate applies them: a field set twice must agree), strict loading,
    then the plan rules (imported from autoplan.plan_rules)."""
    from autoplan.plan_sets import apply_sets

    apply_sets(data, assignments)
    plan = plan_from_dict(data)
    from autoplan.hardware import cluster
    from autoplan.plan_rules import validate_plan

    reasons = validate_plan(plan, plan.model_spec(),
                            cluster(plan.cluster.profile, plan.cluster.num_gpus))
    if reasons:
        raise ConfigError(what, "the imported plan is not valid: " + "; ".join(reasons))
    return plan


# ---- DeepSpeed ---------------------------------------------------------------------------------


def import_deepspeed(
    path: str | Path,
    *,
    model: str | None,
    cluster: str,
    num_gpus: int | None,
    assignments: Sequence[str] = (),
) -> Plan:
    from autoplan.export.megatron_deepspeed_import import import_launch, is_launch

    if is_launch(path):  # a Megatron-DeepSpeed launch (export --to deepspeed with tp or pp > 1)
        _launch_gpus(path, num_gpus)
        return import_launch(path, model=model, cluster=cluster, num_gpus=num_gpus,
                             assignments=assignments)
    what = f"deepspeed config {path}"
    cfg = load_json_text(_read(path, "FILE"), what)
    if not isinstance(cfg, dict):
        raise ConfigError(what, "expected a JSON object")
    if model is None:
        raise ConfigError("--model", "missing", "a DeepSpeed config names no model; pass --model")
    degrees = _degrees(assignments)
    beside = _split_beside(Path(path), cfg, degrees, what)
    data = deepspeed_plan_dict(cfg, num_gpus, what, degrees)
    data["model"] = model
    data["cluster"] = {
        "profile": cluster,
        "num_gpus": data["parallel"]["dp"] * data["parallel"]["tp"] * data["parallel"]["pp"],
    }
    plan = finish_plan(data, list(assignments), what)
    section = cfg.get("pipeline")
    pipeline: dict[str, Any] = section if isinstance(section, dict) else {}
    if (cfg.get("activation_checkpointing") is not None
            and not pipeline.get("activation_checkpoint_interval")
            and plan.recompute.policy.value == "full"
            and not any(a.strip().startswith("recompute") for a in assignments)):
        # the section configures deepspeed.checkpointing; whether blocks are checkpointed is
        # the script's code, which the JSON does not show (said once the import succeeds: a
        # refusal stays one line)
        log.warning("%s: activation_checkpointing read as full recompute of every block (the "
                    "script checkpoints each with deepspeed.checkpointing.checkpoint, as export "
                    "writes it); --set recompute.policy=none if it does not", what)
    if num_gpus is None and not degrees and not beside and not _states_split(cfg):
        log.warning("%s: the JSON records no tensor or pipeline parallelism and no --num-gpus "
                    "was given: read as data parallelism over %d GPUs (train_batch_size / "
                    "micro batch / accumulation); a run that also splits the model (Megatron-"
                    "DeepSpeed, AutoTP) has more: import its launch script, or pass --num-gpus "
                    "and --set parallel.tp=N / --set parallel.pp=N", what, plan.world_size)
    return plan


def _states_split(cfg: dict[str, Any]) -> bool:
    """Whether the JSON itself says the model split: tensor_parallel.autotp_size or
    pipeline.stages (read by deepspeed_plan_dict)."""
    tp, pipe = cfg.get("tensor_parallel"), cfg.get("pipeline")
    return ((isinstance(tp, dict) and tp.get("autotp_size") not in (None, 0))
            or (isinstance(pipe, dict) and pipe.get("stages", "auto") != "auto"))


def _split_beside(config: Path, cfg: dict[str, Any], degrees: dict[str, int],
                  what: str) -> bool:
    """Refuse a JSON whose launch, written beside it by `export --to deepspeed`, runs other
    degrees than the import reads (the JSON records no Megatron tp or pp): a launch that splits
    the model (tp or pp > 1) unless --set gives its degrees, else the JSON would import as data
    parallelism over fewer GPUs than the launch runs; a data-parallel launch (tp = pp = 1)
    when --set splits the model, else the plan would price a split the run never makes, on
    more GPUs than it starts. True when such a launch says the degrees (of one: the JSON alone
    is the whole plan)."""
    from autoplan.export.megatron_deepspeed_import import launch_beside

    found = launch_beside(config)
    if found is None:
        return False
    launch, tp, pp = found
    given = (degrees.get("tp", 1), degrees.get("pp", 1))
    if given == (tp, pp) or _states_split(cfg):
        return True
    problem = ("records no tensor or pipeline parallelism" if not degrees else
               f"read with --set as tp={given[0]} pp={given[1]}")
    if tp * pp > 1:
        fix = f"import {launch} instead, or pass --set parallel.tp={tp} --set parallel.pp={pp}"
    else:
        fix = (f"drop --set {' and --set '.join(f'parallel.{k}' for k in degrees)} (that run "
               "splits nothing), or move the launch away if it is not this JSON's run")
    raise ConfigError(what, f"{problem}, but {launch}, beside it, runs it with tp={tp} pp={pp}",
                      fix)


def _launch_gpus(path: str | Path, num_gpus: int | None) -> None:
    """Refuse a --num-gpus other than the GPUs the DeepSpeed launch starts (its runner's
    --num_nodes x --num_gpus), before its JSON's batch keys disagree with the wrong count."""
    from autoplan.export.megatron_deepspeed_import import SWITCHES
    from autoplan.export.shell_args import Flags, expand_variables, launched_gpus, parse_flags

    flags = parse_flags(expand_variables(_read(path, "FILE")), SWITCHES)
    launched_gpus(Flags(flags, f"deepspeed launch {path}"), num_gpus, "--num_nodes",
                  ("--num_gpus",))


def _degrees(assignments: Sequence[str]) -> dict[str, int]:
    """tp and pp set with --set, which the data-parallel size of a DeepSpeed JSON depends on."""
    out: dict[str, int] = {}
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        name = key.strip().removeprefix("parallel.")
        if key.strip() in ("parallel.tp", "parallel.pp"):
            try:
                out[name] = require_int(int(value), f"--set {key.strip()}")
            except ValueError:
                raise ConfigError(f"--set {key.strip()}", f"got {show(value)}",
                                  "expected a positive integer") from None
    return out


# ---- Megatron-LM ------------------------------------------------------------------------------


def import_megatron(
    path: str | Path,
    *,
    model: str | None,
    cluster: str,
    num_gpus: int | None,
    assignments: Sequence[str] = (),
) -> Plan:
    from autoplan.export.megatron_args import (
        check_megatron_arguments,
        megatron_flags,
        unread_megatron_flags,
    )
    from autoplan.export.megatron_import import megatron_plan_dict
    from autoplan.export.megatron_model import ignored_rope_flags
    from autoplan.export.megatron_runtime import say_runtime

    what = f"megatron arguments {path}"
    text = _read(path, "FILE")
    if not re.search(r"(^|\s)--[a-z]", text):
        json_like = text.lstrip().startswith("{")
        raise ConfigError(what, "holds no Megatron flags (--name value)",
                          "a DeepSpeed JSON imports with --from deepspeed" if json_like else
                          "pass the launch script or arguments file of a Megatron run")
    check_megatron_arguments(text, str(path))
    data = megatron_plan_dict(text, model, num_gpus, what, _device(cluster))
    data["cluster"]["profile"] = cluster
    plan = finish_plan(data, list(assignments), what)
    skipped = unread_megatron_flags(text, what)
    if skipped:  # said once the import succeeds: a refusal stays one line
        log.warning("%s: flags autoplan does not read, skipped: %s", what, " ".join(skipped))
    for said in ignored_rope_flags(text, what):
        log.warning("%s: %s", what, said)
    say_runtime(megatron_flags(text, what))
    return plan


def _device(cluster: str) -> DeviceSpec | None:
    """The device of --cluster, or None where it does not load (finish_plan then names it)."""
    try:
        return load_profile(cluster, "--cluster").device
    except ConfigError:
        return None


IMPORTERS = {"deepspeed": import_deepspeed, "megatron": import_megatron}


def launch_runtime(source: str, path: str | Path) -> tuple[str, str | None]:
    """The runtime preset that prices the run `IMPORTERS[source]` imported from `path` as it
    runs (and a sentence where none prices all of it): deepspeed's, or for a Megatron launch
    the one its dispatcher and --tp-comm-overlap pick (megatron_runtime.launch_runtime)."""
    if source != "megatron":
        return source, None
    from autoplan.export.megatron_args import megatron_flags
    from autoplan.export.megatron_runtime import launch_runtime as megatron_runtime

    what = f"megatron arguments {path}"
    return megatron_runtime(megatron_flags(_read(path, "FILE"), what))


def files_read(source: str, path: str | Path) -> list[Path]:
    """The files `IMPORTERS[source]` reads for `path`: the file, and for a Megatron-DeepSpeed
    launch the DeepSpeed JSON it names (an --out must be none of them)."""
    from autoplan.export.megatron_deepspeed_import import files_read as launch_files
    from autoplan.export.megatron_deepspeed_import import is_launch

    if source == "deepspeed" and is_launch(path):
        return launch_files(Path(path))
    return [Path(path)]
