"""`import --from deepspeed LAUNCH.sh`: the launch `export --to deepspeed` writes beside its JSON
(a Megatron-DeepSpeed launch for plans with tp or pp; for the rest, a plain DeepSpeed launch of
the user's script, degrees 1) read back into plan fields.

The launch gives the degrees, sequence parallelism, recompute, precision and attention; the
DeepSpeed JSON it names with --deepspeed_config gives batch, ZeRO and offload (read by
deepspeed_import.deepspeed_plan_dict). Where both state a value they must agree, and the launch's
model flags must build --model. Flag meanings are those of megatron_deepspeed.py
(deepspeedai/Megatron-DeepSpeed @ f1feb88: megatron/arguments.py validate_args).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.megatron_args import READ_FLAGS, UNREAD_NEIGHBOURS, choice, positive
from autoplan.export.megatron_import import (
    GRANULARITIES,
    RECOMPUTE_METHODS,
    check_one_precision,
    refuse_non_adam,
    say_priced_whole,
    sequence_parallel,
)
from autoplan.export.megatron_model import check_model
from autoplan.export.megatron_neutral import check_positions
from autoplan.export.megatron_norms import MDS_EPS_FLAG, check_norms
from autoplan.export.shell_args import Flags, expand_variables, parse_flags, unread_flags
from autoplan.model_spec import ModelSpec, PositionKind

SWITCHES = frozenset({
    "--deepspeed", "--no-pipeline-parallel", "--sequence-parallel", "--checkpoint-activations",
    "--recompute-activations",
    "--deepspeed-activation-checkpointing", "--bf16", "--fp16", "--use-flash-attn-v2",
    "--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-triton", "--swiglu",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--use-rotary-position-embeddings", "--no-position-embedding",
    "--partition-activations", "--checkpoint-in-cpu", "--contigious-checkpointing",
    "--synchronize-each-layer", "--profile-backward",
})
"""store_true flags of pretrain_gpt.py and the deepspeed launcher's; they take no value."""
DS_LAUNCHER = frozenset(f"--{name}" for name in (
    "hostfile", "include", "exclude", "num_nodes", "min_elastic_nodes", "max_elastic_nodes",
    "num_gpus", "master_port", "master_addr", "node_rank", "launcher", "launcher_args",
    "module", "no_python", "no_local_rank", "no_ssh", "no_ssh_check", "force_multi", "save_pid",
    "enable_each_rank_log", "autotuning", "elastic_training", "bind_cores_to_rank",
    "bind_core_list", "ssh_port", "venv_script", "comment", "account"))
"""The deepspeed launcher's flags (deepspeed/launcher/runner.py parse_args), which share the
launch line with the script's."""
MDS_READ = READ_FLAGS | SWITCHES | frozenset({
    "--deepspeed_config", "--ds-sequence-parallel-size", "--num_nodes", "--num_gpus",
    "--zero-stage", "--num-key-value-heads", "--checkpoint-num-layers", MDS_EPS_FLAG})
"""Flags a Megatron-DeepSpeed launch's import reads: Megatron's it shares (READ_FLAGS), this
module's switches and its own."""
DS_CHECKPOINTING = "--deepspeed-activation-checkpointing"
FLASH = ("--use-flash-attn-v2", "--use-flash-attn", "--use-flash-attn-v1",
         "--use-flash-attn-triton")


def is_launch(path: str | Path) -> bool:
    """A shell script rather than a JSON config."""
    return Path(path).suffix in (".sh", ".bash")


def config_path(launch: Path, ref: str) -> Path:
    """--deepspeed_config as written where it names a file from here (an absolute path, or a
    launch of an older export, relative to where it ran), else its file name beside the launch
    (export writes "$script_dir"/NAME: the launch's own folder)."""
    p = Path(ref)
    if p.is_absolute() or p.is_file():
        return p
    return launch.parent / p.name


def files_read(launch: Path) -> list[Path]:
    """The files importing `launch` reads: the launch and the DeepSpeed JSON it names (the
    launch alone where it names none, or cannot be read: the import says why)."""
    try:
        flags = parse_flags(expand_variables(launch.read_text(encoding="utf-8")), SWITCHES)
    except (OSError, UnicodeDecodeError, ConfigError):
        return [launch]
    ref = flags.get("--deepspeed_config")
    return [launch, config_path(launch, ref)] if isinstance(ref, str) and ref else [launch]


def launch_beside(config: Path) -> tuple[Path, int, int] | None:
    """(launch, tp, pp) of the launch `export --to deepspeed` wrote beside the JSON `config`
    (`--out X.json` writes X.launch.sh, stdout names them ds_config.json and launch.sh) where
    it names `config` with --deepspeed_config; None when there is none, or it cannot be read."""
    for launch in (config.with_name(f"{config.stem}.launch.sh"), config.with_name("launch.sh")):
        try:
            if not launch.is_file() or config.resolve() not in [
                    p.resolve() for p in files_read(launch)[1:]]:
                continue
            f = Flags(parse_flags(expand_variables(launch.read_text(encoding="utf-8")),
                                  SWITCHES), f"deepspeed launch {launch}")
            return (launch, positive(f, "--tensor-model-parallel-size"),
                    positive(f, "--pipeline-model-parallel-size"))
        except (OSError, ValueError, ConfigError):  # UnicodeDecodeError is a ValueError
            continue
    return None


def launch_plan_dict(text: str, launch: Path, num_gpus: int | None, what: str,
                     read_config: Callable[[Path, int, bool], dict[str, Any]],
                     model: ModelSpec) -> dict[str, Any]:
    """Plan fields from the launch and its JSON; `read_config(path, dp, megatron)` gives the
    JSON's (`megatron`: a Megatron-DeepSpeed launch, whose flags replace the JSON's activation
    checkpointing settings; a plain launch of the user's script runs the JSON's);
    `model` (--model) must be the one the launch's shape flags build."""
    f = Flags(parse_flags(expand_variables(text), SWITCHES), what)
    if f.text("--num-layers") is not None:
        # pretrain_gpt.py's argparse refuses a flag it does not define: a misspelling of one
        # read here is refused before it is read as that flag's default (a plain launch's
        # flags are the user's own script's)
        unread_flags(f, MDS_READ, DS_LAUNCHER | UNREAD_NEIGHBOURS, "Megatron-DeepSpeed")
    if not f.has("--deepspeed"):
        raise ConfigError(what, "no --deepspeed flag", "pass a Megatron-DeepSpeed launch "
                          "(deepspeed pretrain_gpt.py ... --deepspeed --deepspeed_config FILE)")
    ref = f.text("--deepspeed_config")
    if not ref:
        raise ConfigError(f"{what} --deepspeed_config", "missing", "name the DeepSpeed JSON")
    if positive(f, "--ds-sequence-parallel-size") > 1:
        raise ConfigError(f"{what} --ds-sequence-parallel-size", "DeepSpeed-Ulysses",
                          "autoplan plans ring context parallelism (cp), not Ulysses")
    tp = positive(f, "--tensor-model-parallel-size")
    pp = positive(f, "--pipeline-model-parallel-size")
    if f.has("--no-pipeline-parallel") and pp > 1:  # validate_args asserts it
        raise ConfigError(f"{what} --no-pipeline-parallel", f"given with pp={pp}",
                          "drop it, or set --pipeline-model-parallel-size 1")
    if num_gpus is None:
        if f.text("--num_nodes") is None or f.text("--num_gpus") is None:
            raise ConfigError("--num-gpus", "missing", "the launch names no --num_nodes and "
                              "--num_gpus; pass --num-gpus")
        num_gpus = positive(f, "--num_nodes") * positive(f, "--num_gpus")
    if num_gpus % (tp * pp):
        raise ConfigError("--num-gpus", f"{num_gpus} is not a multiple of tp*pp = {tp * pp}",
                          "check the launch's degrees")
    data = read_config(config_path(launch, ref), num_gpus // (tp * pp),
                       f.text("--num-layers") is not None)
    data["parallel"] = {"dp": num_gpus // (tp * pp), "tp": tp, "pp": pp, "cp": 1}
    data["sequence_parallel"] = sequence_parallel(f, tp)
    _agree(what, "--micro-batch-size", f.integer("--micro-batch-size"),
           data["batch"]["micro_batch_size"])
    _agree(what, "--global-batch-size", f.integer("--global-batch-size"),
           data["batch"]["global_batch_size"])
    _agree(what, "--zero-stage", f.integer("--zero-stage"), data["zero_stage"])
    if f.text("--num-layers") is None:
        # a plain DeepSpeed launch of the user's own script (what export writes for tp = pp =
        # 1): the model is code, and precision, recompute and attention are the JSON's or the
        # plan's defaults
        return data
    # validate_args: GQA's --num-key-value-heads defaults to --num-attention-heads
    check_model(f, model, tp, "--num-key-value-heads",
                f.integer("--num-key-value-heads", f.integer("--num-attention-heads")),
                fix="pass the --model the launch builds, or correct the launch")
    check_norms(f, model, "pass the --model the launch builds", MDS_EPS_FLAG, qk_norm_flag=False)
    check_positions(f, model.position == PositionKind.LEARNED, model.hidden_size)
    # training.py builds the optimizer from --optimizer (get_megatron_optimizer: adam or sgd)
    # and hands it to deepspeed.initialize, whose engine runs a client optimizer over the
    # JSON's "optimizer" section (engine._configure_optimizer)
    refuse_non_adam(f"{what} --optimizer", f.text("--optimizer", "adam") or "adam")
    check_one_precision(f)
    precision = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    _agree(what, "--bf16/--fp16", precision, data["precision"])
    data["recompute"] = recompute(f, pipeline=not f.has("--no-pipeline-parallel"))
    if f.has(DS_CHECKPOINTING) and data["recompute"]["policy"] == "full":
        checkpoint_flags(f, tp, data["sequence_parallel"])
    data["attention"] = "flash" if any(f.has(x) for x in FLASH) else "eager"
    return data


def checkpoint_flags(f: Flags, tp: int, sp: bool) -> None:
    """What --deepspeed-activation-checkpointing hands deepspeed.checkpointing.configure
    (megatron/initialize.py _configure_deepspeed_checkpointing; these arguments replace the
    JSON's activation_checkpointing values): --checkpoint-in-cpu keeps the checkpointed block
    inputs in host memory, which a plan cannot say (refused); --partition-activations splits
    them over the tensor-parallel ranks, which the plan's price leaves whole (said; with
    sequence parallelism the inputs are split already)."""
    if f.has("--checkpoint-in-cpu"):
        raise ConfigError(f"{f.what} --checkpoint-in-cpu", "checkpointed activations kept in "
                          "host memory, which a plan cannot say", "drop it to import the run "
                          "with them on the GPU")
    if f.has("--partition-activations") and tp > 1 and not sp:
        say_priced_whole(f"{f.what} --partition-activations", tp)


def recompute(f: Flags, pipeline: bool) -> dict[str, Any]:
    """Recompute as Megatron-DeepSpeed runs the launch's flags; the JSON's
    activation_checkpointing section only configures DeepSpeed's checkpoint function for when
    the model calls it. `pipeline`: GPTModelPipe (DeepSpeed's pipeline engine; pretrain_gpt.py
    builds it unless --no-pipeline-parallel), else GPTModel.

    validate_args turns --recompute-activations into granularity selective and asserts no
    --recompute-method with it; selective is ParallelAttention's checkpoint_core_attention.
    Full (--checkpoint-activations, or granularity full) checkpoints, in GPTModelPipe
    (megatron/model/gpt_model.py), every activation_checkpoint_interval blocks: the
    --checkpoint-num-layers, else with method uniform the --recompute-num-layers, else 0 (no
    recompute: "deepspeed's pipeline doesn't support the block recompute method"); in GPTModel
    (ParallelTransformer._checkpointed_forward, megatron/model/transformer.py) groups of
    --checkpoint-num-layers under --deepspeed-activation-checkpointing, else uniform groups or
    the first block of --recompute-num-layers, else ValueError("Invalid activation recompute
    method")."""
    granularity = choice(f, "--recompute-granularity", GRANULARITIES, None)
    method = choice(f, "--recompute-method", RECOMPUTE_METHODS, None)
    if f.has("--recompute-activations"):
        granularity = "selective"
    if not f.has("--checkpoint-activations") and granularity != "full":
        if granularity == "selective" and method is not None:
            raise ConfigError(f"{f.what} --recompute-method", f"{method} with selective "
                              "recompute", "drop it: Megatron-DeepSpeed asserts no method "
                              "for selective granularity")
        return {"policy": granularity or "none"}
    if pipeline:
        if f.has("--checkpoint-activations"):
            group = positive(f, "--checkpoint-num-layers")
        elif method == "uniform":
            group = positive(f, "--recompute-num-layers")
        else:
            raise ConfigError(f"{f.what} --recompute-method", f"{method or 'not given'}: "
                              "DeepSpeed's pipeline engine (GPTModelPipe) then recomputes "
                              "nothing", "use --recompute-method uniform, or "
                              "--checkpoint-activations with --checkpoint-num-layers")
    elif f.has(DS_CHECKPOINTING):
        group = positive(f, "--checkpoint-num-layers")
    elif method == "uniform":
        group = positive(f, "--recompute-num-layers")
    elif method == "block":
        return {"policy": "full", "method": "block",
                "num_layers": positive(f, "--recompute-num-layers")}
    else:
        raise ConfigError(f"{f.what} --recompute-method", "not given: GPTModel "
                          "(--no-pipeline-parallel) then raises 'Invalid activation recompute "
                          "method'", "add --recompute-method uniform or block, or "
                          f"{DS_CHECKPOINTING}")
    if group == 1:  # every block checkpointed on its own
        return {"policy": "full"}
    return {"policy": "full", "method": "uniform", "num_layers": group}


def _agree(what: str, flag: str, launch: Any, config: Any) -> None:
    if launch is not None and launch != config:
        raise ConfigError(f"{what} {flag}", f"the launch says {launch}, the DeepSpeed config "
                          f"{config}", "make the two agree")


def import_launch(path: str | Path, *, model: str | None, cluster: str, num_gpus: int | None,
                  assignments: Any = ()) -> Any:  # -> Plan
    """The plan a Megatron-DeepSpeed launch and its DeepSpeed JSON describe."""
    from autoplan.export.deepspeed_import import deepspeed_plan_dict
    from autoplan.export.importers import _read, finish_plan
    from autoplan.model_spec import load_model
    from autoplan.yaml_parse import load_json_text

    what = f"deepspeed launch {path}"
    if model is None:
        raise ConfigError("--model", "missing", "a Megatron-DeepSpeed launch names no model "
                          "preset; pass --model")

    def read_config(p: Path, dp: int, megatron: bool) -> dict[str, Any]:
        cfg = load_json_text(_read(p, "--deepspeed_config"), f"deepspeed config {p}")
        if not isinstance(cfg, dict):
            raise ConfigError(f"deepspeed config {p}", "expected a JSON object")
        return deepspeed_plan_dict(cfg, dp, f"deepspeed config {p}",
                                   checkpoint_settings=not megatron, client_optimizer=megatron)

    data = launch_plan_dict(_read(path, "FILE"), Path(path), num_gpus, what, read_config,
                            load_model(model))
    p = data["parallel"]
    data["model"] = model
    data["cluster"] = {"profile": cluster, "num_gpus": p["dp"] * p["tp"] * p["pp"]}
    return finish_plan(data, list(assignments), what)
