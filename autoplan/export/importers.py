"""Read an existing DeepSpeed JSON config or Megatron-LM argument list into a Plan, so that
`autoplan estimate` can score it (and a search can compare it with the best plan it finds).

Each reader builds a plan mapping; `finish_plan` applies --set edits, loads it strictly and checks
it with the same rules as every other plan. Settings autoplan cannot represent are errors.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.deepspeed_keys import DEEPSPEED_ADAM, SECTION_KEYS
from autoplan.export.megatron_import import refuse_non_adam, say_priced_whole
from autoplan.hardware import DeviceSpec, load_profile
from autoplan.plan import Plan, plan_from_dict
from autoplan.yaml_io import did_you_mean, load_json_text, show

log = logging.getLogger(__name__)


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
        raise ConfigError(where, f"got {show(value)}", "expected a positive integer")
    return value


def finish_plan(data: dict[str, Any], assignments: list[str], what: str) -> Plan:
    """--set edits (as estimate applies them: a field set twice must agree), strict loading,
    then the plan rules (imported from autoplan.plan_rules)."""
    from autoplan.plan_args import apply_sets

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


def _section(cfg: dict[str, Any], key: str, what: str, parent: str = "") -> dict[str, Any]:
    """A config section as a mapping ({} when absent); a list or scalar is refused, and so is a
    key DeepSpeed does not define in it (SECTION_KEYS), which DeepSpeed refuses too."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what} {parent}{key}", f"got {show(value)} ({type(value).__name__})",
                          'expected a JSON object, e.g. {"enabled": true}')
    known = SECTION_KEYS.get(parent + key, frozenset(value))
    for name in value:
        if name not in known:
            fix = did_you_mean(name, known) or f"expected one of {', '.join(sorted(known))}"
            raise ConfigError(f"{what} {parent}{key}.{name}", "not a DeepSpeed key "
                              "(DeepSpeed refuses it)", fix)
    return value


LEGACY_OFFLOAD = {"offload_optimizer": "cpu_offload", "offload_param": "cpu_offload_param"}
"""DeepSpeed's deprecated switch for each offload section: true is the section with device cpu
(runtime/zero/config.py new_param_fn); given beside its section, DeepSpeed's config refuses it
("Cannot provide deprecated parameter ... and replacing parameter ... together")."""
ZERO_PLUS_PLUS = {"zero_hpz_partition_size": 1, "zero_quantized_weights": False,
                  "zero_quantized_gradients": False}
"""ZeRO++ keys (runtime/zero/config.py) and their plain ZeRO values: hpZ's secondary weight
shards, qwZ's int8 weight all-gather and qgZ's int4 gradient reduce-scatter move other bytes
than the plain ZeRO-3 collectives autoplan prices."""


def _offload(zero: dict[str, Any], key: str, what: str) -> bool:
    legacy = LEGACY_OFFLOAD[key]
    if legacy in zero:
        flag, where = zero[legacy], f"{what} zero_optimization.{legacy}"
        if key in zero:
            raise ConfigError(where, f"given with zero_optimization.{key}",
                              f"drop the deprecated {legacy} (DeepSpeed refuses both)")
        if not isinstance(flag, bool):
            raise ConfigError(where, f"got {show(flag)}", "expected true or false")
        return flag
    section = _section(zero, key, what, "zero_optimization.")
    device = section.get("device", "none")
    where = f"{what} zero_optimization.{key}.device"
    if device == "nvme":
        raise ConfigError(where, "got 'nvme'", "autoplan models offload to CPU memory only")
    if device not in ("cpu", "none", None):
        raise ConfigError(where, f"got {show(device)}", "expected one of cpu, none")
    ratio = section.get("ratio", 1.0)  # offload_optimizer's share of the states on the host
    if key == "offload_optimizer" and device == "cpu" and (isinstance(ratio, bool)
                                                           or ratio != 1):
        raise ConfigError(f"{what} zero_optimization.{key}.ratio", f"got {show(ratio)}",
                          "autoplan models offloading all of the optimizer (ratio 1.0)")
    return device == "cpu"


def _zero_plus_plus(zero: dict[str, Any], what: str) -> None:
    """Refuse ZeRO++ (a plan has no field for it); values are shown as the JSON spells them."""
    import json

    for key, plain in ZERO_PLUS_PLUS.items():
        value = zero.get(key, plain)
        if value != plain or type(value) is not type(plain):
            shown = json.dumps(value) if isinstance(value, bool) else show(value)
            raise ConfigError(f"{what} zero_optimization.{key}", f"got {shown}",
                              f"autoplan prices plain ZeRO, not ZeRO++: set {json.dumps(plain)}")


def _switch(section: dict[str, Any], key: str, where: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}", f"got {show(value)}", "expected true or false")
    return value


def _activation_checkpointing(section: dict[str, Any], tp: int, what: str) -> None:
    """deepspeed.checkpointing's settings (runtime/activation_checkpointing/config.py):
    cpu_checkpointing keeps the checkpointed block inputs in host memory, which a plan cannot
    say (refused); partition_activations splits them over the model-parallel ranks, which the
    plan's price leaves whole on each (said: its memory is priced high)."""
    where = f"{what} activation_checkpointing"
    if _switch(section, "cpu_checkpointing", where):
        raise ConfigError(f"{where}.cpu_checkpointing", "true: checkpointed activations kept "
                          "in host memory, which a plan cannot say", "set it false to import "
                          "the run with them on the GPU")
    if _switch(section, "partition_activations", where) and tp > 1:
        say_priced_whole(f"{where}.partition_activations", tp)


def _mics(zero: dict[str, Any], stage: int, dp: int, what: str) -> None:
    """MiCS (zero_optimization.mics_shard_size > 0 at stage 3, DeepSpeed's engine builds
    MiCS_Optimizer in its stage-3 branch: ZeRO-3 sharded over sub-groups of that many ranks,
    replicated across them) is HSDP, which autoplan's deepspeed runtime has not
    (RuntimeTraits.hsdp_zero_stages): refused rather than priced as ZeRO-3 over all ranks. At
    stages 0-2 the key does nothing; a shard group of all dp ranks is plain ZeRO-3."""
    size = zero.get("mics_shard_size", -1)
    where = f"{what} zero_optimization.mics_shard_size"
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(where, f"got {show(size)}", "expected a whole number (-1: off)")
    if stage == 3 and 0 < size < dp:
        raise ConfigError(where, f"got {size}: MiCS shards over sub-groups of {size} of the "
                          f"{dp} data-parallel ranks (HSDP)", "the deepspeed runtime prices "
                          "ZeRO over all of them: set -1 to import the run as plain ZeRO-3")


def _enabled(cfg: dict[str, Any], key: str, what: str) -> bool:
    flag = _section(cfg, key, what).get("enabled", False)
    if flag == "auto":
        raise ConfigError(f"{what} {key}.enabled", "is 'auto'", "resolve it to true or false")
    if not isinstance(flag, bool):
        raise ConfigError(f"{what} {key}.enabled", f"got {show(flag)}", "expected true or false")
    return flag


def _precision(cfg: dict[str, Any], what: str) -> str:
    if _enabled(cfg, "amp", what):  # runtime/engine.py: amp.initialize(model, optimizer, ...)
        raise ConfigError(f"{what} amp.enabled", "true: NVIDIA Apex AMP, whose casts and "
                          "weight copies (by opt_level) no plan precision prices",
                          'use "bf16": {"enabled": true} or "fp16": {"enabled": true}, '
                          "which autoplan prices")
    # precision_config.get_bfloat16_config: the legacy "bfloat16" only where "bf16" is absent
    bf16 = _enabled(cfg, "bf16" if cfg.get("bf16") is not None else "bfloat16", what)
    fp16 = _enabled(cfg, "fp16", what)
    if bf16 and fp16:
        raise ConfigError(f"{what} fp16.enabled", "true together with bf16.enabled",
                          "enable one of fp16, bf16 (DeepSpeed refuses both)")
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def _optimizer(cfg: dict[str, Any], what: str) -> None:
    """Refuse an optimizer the cost model does not price (SGD, Lamb, Lion, 1-bit Adam, ...); no
    optimizer section is the script's own optimizer, taken for Adam."""
    kind = _section(cfg, "optimizer", what).get("type")
    if kind is None:
        return
    if not isinstance(kind, str):
        raise ConfigError(f"{what} optimizer.type", f"got {show(kind)}",
                          "expected an optimizer name, e.g. \"AdamW\"")
    refuse_non_adam(f"{what} optimizer.type", kind, DEEPSPEED_ADAM, fold_case=True)


def _zero_stage(zero: dict[str, Any], what: str) -> int:
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        raise ConfigError(f"{what} zero_optimization.stage", f"got {show(stage)}",
                          "expected one of 0, 1, 2, 3")
    return stage


def deepspeed_plan_dict(cfg: dict[str, Any], num_gpus: int | None, what: str,
                        degrees: dict[str, int] | None = None,
                        checkpoint_settings: bool = True,
                        client_optimizer: bool = False) -> dict[str, Any]:
    """Plan fields a DeepSpeed config determines (model and cluster come from the caller);
    `degrees`: tp and pp the caller knows where the JSON cannot say them (--set);
    `checkpoint_settings`: the activation_checkpointing section's partition and host settings
    govern (False under a Megatron-DeepSpeed launch, whose flags replace them);
    `client_optimizer`: the script hands deepspeed.initialize its own optimizer, which the
    engine runs over the JSON's section (Megatron-DeepSpeed's --optimizer), so the section's
    type is not the run's and is not checked here."""
    autotp = _section(cfg, "tensor_parallel", what).get("autotp_size", 0)
    tp = 1 if autotp == 0 else _require_int(autotp, f"{what} tensor_parallel.autotp_size")
    pipeline = _section(cfg, "pipeline", what)
    stages = pipeline.get("stages", "auto")
    pp = 1 if stages == "auto" else _require_int(stages, f"{what} pipeline.stages")
    tp, pp = (degrees or {}).get("tp", tp), (degrees or {}).get("pp", pp)
    ulysses = cfg.get("sequence_parallel_size")
    if ulysses is not None and _require_int(ulysses, f"{what} sequence_parallel_size") > 1:
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
        fix = "DeepSpeed requires train_batch_size = micro * accumulation * dp"
        if num_gpus is not None and gbs % (mb * gas) == 0 and num_gpus % (gbs // (mb * gas)) == 0:
            split = num_gpus // (gbs // (mb * gas)) // (tp * pp)
            fix = (f"{fix}, so the model is split {split} ways, which the JSON does not record: "
                   "import the Megatron-DeepSpeed launch written beside it, or pass "
                   "--set parallel.tp=N / --set parallel.pp=N")
        raise ConfigError(f"{what} train_batch_size", f"{gbs} != {mb} * {gas} * dp {dp}", fix)
    zero = _section(cfg, "zero_optimization", what)
    _zero_plus_plus(zero, what)
    interval = pipeline.get("activation_checkpoint_interval", 0)
    if interval != 0:
        _require_int(interval, f"{what} pipeline.activation_checkpoint_interval")
    # a section (any settings) is what export writes for a script that checkpoints each block
    # (deepspeed.checkpointing.checkpoint); null, like no key, configures nothing
    checkpointing = cfg.get("activation_checkpointing") is not None or interval > 0
    section = _section(cfg, "activation_checkpointing", what)
    if checkpoint_settings:
        _activation_checkpointing(section, tp, what)
    stage = _zero_stage(zero, what)
    _mics(zero, stage, dp, what)
    if not client_optimizer:
        _optimizer(cfg, what)
    return {
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": 1},
        "batch": {"micro_batch_size": mb, "global_batch_size": gbs},
        "grad_reduce_dtype": _reduce_dtype(cfg, what),
        "zero_stage": stage,
        "offload": {
            "optimizer": _offload(zero, "offload_optimizer", what),
            "params": _offload(zero, "offload_param", what),
        },
        "recompute": {"policy": "full" if checkpointing else "none"},
        "precision": _precision(cfg, what),
    }


def _reduce_dtype(cfg: dict[str, Any], what: str) -> str | None:
    """communication_data_type: the dtype of DeepSpeed's gradient averaging."""
    value = cfg.get("communication_data_type")
    if value is None or value in ("fp32", "bf16"):
        return value
    raise ConfigError(f"{what} communication_data_type", f"got {show(value)}",
                      "a plan reduces gradients in fp32 or bf16 (grad_reduce_dtype)")


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
                out[name] = _require_int(int(value), f"--set {key.strip()}")
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
