"""Megatron-LM `pretrain_gpt.py` arguments (a file of flags, or a launch script with them) into
plan fields: degrees, ZeRO, recompute, precision and attention (the flags: megatron_args; the
model: megatron_model; stages: megatron_pipeline). What a plan cannot say (SGD, ...) is refused."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.megatron_args import (
    LAUNCHER_FLAGS,
    READ_FLAGS,
    UNREAD_NEIGHBOURS,
    choice,
    flag_values,
    megatron_flags,
    positive,
)
from autoplan.export.megatron_model import launch_model
from autoplan.export.megatron_moe import expert_degrees
from autoplan.export.megatron_neutral import check_positions
from autoplan.export.megatron_pipeline import pipeline_section
from autoplan.export.megatron_runtime import check_tp_overlap
from autoplan.export.megatron_te import ATTENTION_BACKENDS
from autoplan.export.shell_args import Flags, expand_variables, launched_gpus, unread_flags
from autoplan.hardware_devices import DeviceSpec
from autoplan.model_spec import PositionKind, load_model
from autoplan.yaml_io import show

log = logging.getLogger(__name__)

BACKEND_ATTENTION = {v: k.value for k, v in ATTENTION_BACKENDS.items()} | {
    "flash": "flash", "auto": "flash", "local": "eager"}
"""Megatron-Core's AttnBackend (transformer/enums.py: flash, fused, unfused, local, auto) -> plan
attention: flash and cuDNN fused kernels keep no s x s scores; unfused and local do (and any
backend under --transformer-impl local: _attention)."""
TRANSFORMER_IMPLS = ("local", "transformer_engine", "inference_optimized")
"""--transformer-impl choices (megatron/training/arguments.py: local and transformer_engine, the
default; later releases add inference_optimized)."""
FP8_FORMATS = ("e4m3", "hybrid")
"""--fp8-format choices (_add_transformer_engine_args): FP8 GEMMs, a plan's precision fp8."""
GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
"""Megatron's --recompute-granularity and --recompute-method choices."""


def megatron_plan_dict(
    text: str, model_ref: Any, num_gpus: int | None, what: str,
    device: DeviceSpec | None = None,
) -> dict[str, Any]:
    """Plan fields (and an inline model unless `model_ref`) from Megatron arguments; `device`:
    the GPU the run is imported for, which settles --attention-backend auto."""
    f = megatron_flags(text, what)
    # a misspelled flag is refused before the flag it means is read as its default
    unread_flags(f, READ_FLAGS, LAUNCHER_FLAGS | UNREAD_NEIGHBOURS, "Megatron")
    tp, pp = positive(f, "--tensor-model-parallel-size"), positive(f, "--pipeline-model-parallel-size")
    cp = positive(f, "--context-parallel-size")
    num_gpus = _num_gpus(f, num_gpus, tp * pp * cp)
    dp = num_gpus // (tp * pp * cp)
    model_ref = launch_model(f, model_ref, text, tp)
    spec = load_model(model_ref)
    layers = spec.num_layers
    check_positions(f, spec.position == PositionKind.LEARNED, spec.hidden_size)
    fraction = f.number("--optimizer-offload-fraction", 1.0)
    if f.has("--optimizer-cpu-offload") and fraction != 1.0:
        raise ConfigError(
            f"{what} --optimizer-offload-fraction",
            f"got {fraction}",
            "autoplan models offloading all optimizer states (1.0)",
        )
    _refuse_unplanned(f, cp, text)
    check_tp_overlap(f, tp, f.has("--sequence-parallel"))  # the runtime it picks: importers
    recompute = _recompute(f, flag_values(expand_variables(text), "--recompute-modules"))
    if f.has("--distribute-saved-activations"):
        _distributed_checkpoints(f, tp, recompute, sequence_parallel(f, tp))
    mb = f.need("--micro-batch-size", "add it (Megatron needs one; --model gives no batch)")
    return {
        "model": model_ref,
        "cluster": {"num_gpus": num_gpus},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, **expert_degrees(f, tp),
                     **_hsdp(f, dp)},
        "sequence_parallel": sequence_parallel(f, tp),
        "pipeline": pipeline_section(f, layers, pp),
        "zero_stage": _zero(f),
        "offload": {"optimizer": f.has("--optimizer-cpu-offload"), "params": False},
        "recompute": recompute,
        "batch": {
            "micro_batch_size": mb,
            "global_batch_size": f.integer("--global-batch-size", mb * dp),
        },
        "precision": _precision(f),
        "attention": _attention(f, device),
        "grad_reduce_dtype": "bf16" if f.has("--grad-reduce-in-bf16") else
        "fp32" if f.has("--accumulate-allreduce-grads-in-fp32") else None,
    }


def _num_gpus(f: Flags, num_gpus: int | None, model_parallel: int) -> int:
    """The job's GPUs: --num-gpus or the launcher's count (they must agree), a multiple of the
    model-parallel size tp * pp * cp."""
    num_gpus = launched_gpus(f, num_gpus, "--nnodes", ("--nproc-per-node", "--nproc_per_node"))
    if num_gpus is None:
        raise ConfigError("--num-gpus", "missing", "the arguments do not fix the GPU count")
    if num_gpus % model_parallel:
        raise ConfigError(
            "--num-gpus",
            f"{num_gpus} is not a multiple of tp*pp*cp = {model_parallel}",
            "check the GPU count",
        )
    return num_gpus


def _zero(f: Flags) -> int:
    if f.has("--use-torch-fsdp2"):  # FSDP2 reshards after forward (ZeRO-3) unless told not to
        return 2 if f.has("--torch-fsdp2-no-reshard-after-forward") else 3
    if f.has("--use-megatron-fsdp"):
        strategy = f.text("--data-parallel-sharding-strategy", "no_shard")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            raise ConfigError(
                f"{f.what} --data-parallel-sharding-strategy",
                f"got {strategy!r}",
                f"expected one of {', '.join(stages)}",
            )
        return stages[strategy]
    return 1 if f.has("--use-distributed-optimizer") else 0


def _recompute(f: Flags, modules: list[str] | None = None) -> dict[str, Any]:
    granularity = choice(f, "--recompute-granularity", GRANULARITIES, None)
    if granularity is None and f.has("--recompute-activations"):
        granularity = "selective"  # Megatron: --recompute-activations means selective
    if granularity in (None, "selective"):
        out: dict[str, Any] = {"policy": granularity or "none", "num_layers": None}
        # Megatron-Core's default recompute_modules is [core_attn]: what plain selective means
        if granularity == "selective" and modules and modules != ["core_attn"]:
            out["modules"] = modules  # the plan's loader checks the names
        return out
    method = choice(f, "--recompute-method", RECOMPUTE_METHODS, None)
    count = f.integer("--recompute-num-layers")
    if method == "uniform" and count is not None and count > 1:  # groups of count layers
        return {"policy": "full", "num_layers": count, "method": "uniform"}
    # block: that many layers per stage; uniform by 1 (or none): every layer, one at a time.
    return {"policy": "full", "num_layers": count if method == "block" else None}


CP_COMM_TYPES = ("p2p", "all_gather", "allgather", "a2a", "a2a+p2p")
"""--cp-comm-type's values (megatron/training/arguments.py: nargs='+', one for all layers or one
per layer; default p2p). Megatron passes them to Transformer Engine's cp_comm_type, which takes
all_gather; Megatron's help spells it allgather. `export --to megatron` writes p2p."""


def _refuse_unplanned(f: Flags, cp: int, text: str) -> None:
    """Megatron settings a plan cannot say, refused rather than priced as something else:
    all-to-all context parallelism (a2a, a2a+p2p: Ulysses-style head scattering; autoplan plans
    and prices the ring, p2p or allgather, as the DeepSpeed importer refuses Ulysses), an
    optimizer other than Adam (the cost model prices Adam's 12 bytes of state per parameter),
    and Transformer Engine's --cpu-offloading of layers' activations and weights."""
    kinds = flag_values(expand_variables(text), "--cp-comm-type") or ["p2p"]
    for kind in kinds:
        if kind not in CP_COMM_TYPES:
            raise ConfigError(f"{f.what} --cp-comm-type", f"got {show(kind)}",
                              f"expected one of {', '.join(CP_COMM_TYPES)}")
    if cp > 1 and any(kind.startswith("a2a") for kind in kinds):
        raise ConfigError(f"{f.what} --cp-comm-type", f"{' '.join(kinds)}: all-to-all "
                          "context parallelism", "autoplan plans ring context parallelism: "
                          "import the run with --cp-comm-type p2p or all_gather")
    if cp > 1 and any(kind in ("all_gather", "allgather") for kind in kinds):
        _say_cp_all_gather(f"{f.what} --cp-comm-type")
    refuse_non_adam(f"{f.what} --optimizer", f.text("--optimizer", "adam") or "adam")
    if f.has("--cpu-offloading"):
        raise ConfigError(f"{f.what} --cpu-offloading", "offloads layers' activations and "
                          "weights to the host, which a plan cannot say", "drop it to import "
                          "the run without it (its activations then priced on the GPU)")


def _say_cp_all_gather(setting: str) -> None:
    """Say how to price Transformer Engine's all-gather context parallelism: a plan carries no
    runtime, and the megatron and nemo presets price TE's P2P ring (cp_exchange te-p2p, the
    default kind); a traits file with cp_exchange all-gather prices the gathered K/V instead."""
    log.warning("%s: all_gather K/V exchange: the megatron and nemo runtimes price TE's P2P "
                "ring; to price the all-gather, estimate with --runtime FILE, a traits YAML of "
                "`base: megatron` and `cp_exchange: all-gather`", setting)


def refuse_non_adam(where: str, optimizer: str, adam: Collection[str] = ("adam",),
                    fold_case: bool = False) -> None:
    """Refuse an optimizer the cost model does not price: it prices Adam's states (fp32 master
    weights and two moments, 12 bytes per parameter). `adam`: the launcher's names for Adam
    (Megatron's --optimizer adam; DeepSpeed's types, whose case it folds: `fold_case`)."""
    if (optimizer.lower() if fold_case else optimizer) not in adam:
        raise ConfigError(where, f"got {show(optimizer)}", "autoplan prices Adam's states "
                          "(12 bytes per parameter): import an Adam run")


def _distributed_checkpoints(f: Flags, tp: int, recompute: dict[str, Any], sp: bool) -> None:
    """--distribute-saved-activations, as Megatron takes it: validate_args asserts tp > 1 and
    full recompute granularity with a --recompute-method, and TransformerConfig raises with
    sequence parallelism; where it runs, it splits each checkpointed block input over the
    tensor-parallel ranks, which a plan cannot say (said: priced whole)."""
    flag = f"{f.what} --distribute-saved-activations"
    if tp == 1 or recompute["policy"] != "full" or f.text("--recompute-method") is None:
        raise ConfigError(flag, f"with tp={tp} and {recompute['policy']} recompute",
                          "Megatron takes it only with tp > 1, --recompute-granularity full "
                          "and a --recompute-method: drop it")
    if sp:
        raise ConfigError(flag, "with --sequence-parallel", "Megatron refuses the two "
                          "together (sequence parallelism already splits those inputs): drop it")
    say_priced_whole(flag, tp)


def say_priced_whole(setting: str, tp: int) -> None:
    """Say that a run's split of its checkpointed block inputs over the tensor-parallel ranks
    (Megatron's --distribute-saved-activations, DeepSpeed's partition_activations), which a
    plan cannot carry, is priced without it."""
    log.warning("%s: priced without it (each checkpointed block input whole on every one of "
                "the %d tensor-parallel ranks): the plan's memory is high by (tp - 1)/tp of "
                "those inputs", setting, tp)


def _attention(f: Flags, device: DeviceSpec | None = None) -> str:
    """Plan attention of --attention-backend under --transformer-impl: the local spec
    (gpt_layer_specs.get_gpt_layer_local_spec) builds Megatron-Core's own unfused
    DotProductAttention, full s x s scores, whatever the backend says. `auto` (the default) is
    Transformer Engine's pick: a fused kernel, or unfused on a GPU older than Ampere, where its
    fused backends do not run (kernel_rules.fused_attention_on)."""
    backend = choice(f, "--attention-backend", BACKEND_ATTENTION, "auto")
    if choice(f, "--transformer-impl", TRANSFORMER_IMPLS, "transformer_engine") == "local":
        return "eager"
    if backend == "auto" and device is not None:
        from autoplan.cost.kernel_rules import fused_attention_on
        from autoplan.cost.runtimes import load_runtime

        if not fused_attention_on(load_runtime("megatron"), device):
            return "eager"
    return BACKEND_ATTENTION[str(backend)]


def _precision(f: Flags) -> str:
    """--bf16 / --fp16 / neither (fp32); --fp8-format in a bf16 run: fp8 GEMMs."""
    check_one_precision(f)
    if choice(f, "--fp8-format", FP8_FORMATS, None) is None:
        return "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    if not f.has("--bf16"):
        raise ConfigError(f"{f.what} --fp8-format", "without --bf16",
                          "autoplan plans fp8 GEMMs in a bf16 run (precision fp8); add --bf16")
    return "fp8"


def check_one_precision(f: Flags) -> None:
    """Refuse --fp16 with --bf16: validate_args asserts `not args.bf16` under --fp16 (Megatron-LM
    megatron/training/arguments.py; Megatron-DeepSpeed megatron/arguments.py likewise)."""
    if f.has("--fp16") and f.has("--bf16"):
        raise ConfigError(f"{f.what} --fp16", "given with --bf16",
                          "keep one of them: Megatron refuses both")


def sequence_parallel(f: Flags, tp: int) -> bool:
    """--sequence-parallel, which validate_args turns off at tp=1 (with a warning in
    Megatron-LM; silently in Megatron-DeepSpeed): there is no tensor-parallel group to split
    the sequence over."""
    if f.has("--sequence-parallel") and tp == 1:
        log.warning("%s: --sequence-parallel at tp=1 is off, as Megatron turns it off",
                    f.what)
        return False
    return f.has("--sequence-parallel")


def _hsdp(f: Flags, dp: int) -> dict[str, Any]:
    """--num-distributed-optimizer-instances N (N copies of the distributed optimizer, each
    sharded over dp / N ranks, gradients all-reduced across copies): HSDP's dp_shard = dp / N."""
    n = f.integer("--num-distributed-optimizer-instances", 1) or 1
    if n == 1:
        return {}
    if n < 1 or dp % n:
        raise ConfigError(f"{f.what} --num-distributed-optimizer-instances", f"got {n}",
                          f"expected a divisor of the data-parallel size {dp}")
    return {"dp_shard": dp // n}
