"""A DeepSpeed JSON config read into plan fields (deepspeed_plan_dict): degrees, batch, ZeRO,
offload, precision and recompute. Keys DeepSpeed refuses, and settings a plan cannot say, are
refused; model and cluster are the caller's (importers.import_deepspeed)."""

from __future__ import annotations

from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.deepspeed_keys import DEEPSPEED_ADAM, SECTION_KEYS
from autoplan.export.megatron_import import refuse_non_adam, say_priced_whole
from autoplan.yaml_io import did_you_mean, show


def _exact(n: int, d: int, what: str, fix: str) -> int:
    if d <= 0 or n % d:
        raise ConfigError(what, f"{n} is not a multiple of {d}", fix)
    return n // d


def require_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(where, f"got {show(value)}", "expected a positive integer")
    return value


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
    tp, pp, pipeline = _model_split(cfg, what, degrees)
    dp, mb, gbs = _batch(cfg, num_gpus, tp, pp, what)
    zero = _section(cfg, "zero_optimization", what)
    _zero_plus_plus(zero, what)
    interval = pipeline.get("activation_checkpoint_interval", 0)
    if interval != 0:
        require_int(interval, f"{what} pipeline.activation_checkpoint_interval")
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


def _model_split(cfg: dict[str, Any], what: str,
                 degrees: dict[str, int] | None) -> tuple[int, int, dict[str, Any]]:
    """tp and pp (tensor_parallel.autotp_size and pipeline.stages, unless `degrees` gives them)
    and the pipeline section; Ulysses sequence parallelism is refused."""
    autotp = _section(cfg, "tensor_parallel", what).get("autotp_size", 0)
    tp = 1 if autotp == 0 else require_int(autotp, f"{what} tensor_parallel.autotp_size")
    pipeline = _section(cfg, "pipeline", what)
    stages = pipeline.get("stages", "auto")
    pp = 1 if stages == "auto" else require_int(stages, f"{what} pipeline.stages")
    tp, pp = (degrees or {}).get("tp", tp), (degrees or {}).get("pp", pp)
    ulysses = cfg.get("sequence_parallel_size")
    if ulysses is not None and require_int(ulysses, f"{what} sequence_parallel_size") > 1:
        raise ConfigError(
            f"{what} sequence_parallel_size",
            "Ulysses sequence parallelism",
            "autoplan plans ring context parallelism (cp), not Ulysses",
        )
    return tp, pp, pipeline


def _batch(cfg: dict[str, Any], num_gpus: int | None, tp: int, pp: int,
           what: str) -> tuple[int, int, int]:
    """dp, micro batch and global batch from the batch keys and --num-gpus, which must agree as
    DeepSpeed requires: train_batch_size = micro batch * accumulation * dp."""
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
            require_int(value, f"{what} {key}")
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
    return dp, mb, gbs


def _reduce_dtype(cfg: dict[str, Any], what: str) -> str | None:
    """communication_data_type: the dtype of DeepSpeed's gradient averaging."""
    value = cfg.get("communication_data_type")
    if value is None or value in ("fp32", "bf16"):
        return value
    raise ConfigError(f"{what} communication_data_type", f"got {show(value)}",
                      "a plan reduces gradients in fp32 or bf16 (grad_reduce_dtype)")
