"""`import --from deepspeed LAUNCH.sh`: the launch `export --to deepspeed` writes beside its JSON
(a Megatron-DeepSpeed launch for plans with tp or pp; for the rest, a plain DeepSpeed launch of
the user's script, degrees 1) read back into plan fields.

The launch gives the degrees, sequence parallelism, recompute, precision and attention; the
DeepSpeed JSON it names with --deepspeed_config gives batch, ZeRO and offload (read by
importers.deepspeed_plan_dict). Where both state a value they must agree. Flag meanings are those
of megatron_deepspeed.py (deepspeedai/Megatron-DeepSpeed @ f1feb88).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.shell_args import Flags, expand_variables, parse_flags

SWITCHES = frozenset({
    "--deepspeed", "--no-pipeline-parallel", "--sequence-parallel", "--checkpoint-activations",
    "--deepspeed-activation-checkpointing", "--bf16", "--fp16", "--use-flash-attn-v2",
    "--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-triton", "--swiglu",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--use-rotary-position-embeddings", "--no-position-embedding",
})
"""store_true flags of pretrain_gpt.py and the deepspeed launcher's; they take no value."""
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


def launch_plan_dict(text: str, launch: Path, num_gpus: int | None, what: str,
                     read_config: Callable[[Path, int], dict[str, Any]]) -> dict[str, Any]:
    """Plan fields from the launch and its JSON; `read_config(path, dp)` gives the JSON's."""
    f = Flags(parse_flags(expand_variables(text), SWITCHES), what)
    if not f.has("--deepspeed"):
        raise ConfigError(what, "no --deepspeed flag", "pass a Megatron-DeepSpeed launch "
                          "(deepspeed pretrain_gpt.py ... --deepspeed --deepspeed_config FILE)")
    ref = f.text("--deepspeed_config")
    if not ref:
        raise ConfigError(f"{what} --deepspeed_config", "missing", "name the DeepSpeed JSON")
    if (f.integer("--ds-sequence-parallel-size", 1) or 1) > 1:
        raise ConfigError(f"{what} --ds-sequence-parallel-size", "DeepSpeed-Ulysses",
                          "autoplan plans ring context parallelism (cp), not Ulysses")
    tp = f.integer("--tensor-model-parallel-size", 1) or 1
    pp = f.integer("--pipeline-model-parallel-size", 1) or 1
    if num_gpus is None:
        nodes, gpus = f.integer("--num_nodes"), f.integer("--num_gpus")
        if nodes is None or gpus is None:
            raise ConfigError("--num-gpus", "missing", "the launch names no --num_nodes and "
                              "--num_gpus; pass --num-gpus")
        num_gpus = nodes * gpus
    if num_gpus % (tp * pp):
        raise ConfigError("--num-gpus", f"{num_gpus} is not a multiple of tp*pp = {tp * pp}",
                          "check the launch's degrees")
    data = read_config(config_path(launch, ref), num_gpus // (tp * pp))
    data["parallel"] = {"dp": num_gpus // (tp * pp), "tp": tp, "pp": pp, "cp": 1}
    data["sequence_parallel"] = f.has("--sequence-parallel")
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
    precision = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    _agree(what, "--bf16/--fp16", precision, data["precision"])
    if f.has("--checkpoint-activations") or f.text("--recompute-granularity") == "full":
        data["recompute"] = {"policy": "full"}
        group = f.integer("--checkpoint-num-layers")  # checkpointed groups of that many blocks
        if group is not None and group > 1:
            data["recompute"] = {"policy": "full", "method": "uniform", "num_layers": group}
    elif f.text("--recompute-granularity") == "selective":
        data["recompute"] = {"policy": "selective"}
    elif f.text("--recompute-granularity") is not None:
        raise ConfigError(f"{what} --recompute-granularity",
                          f"got {f.text('--recompute-granularity')!r}", "use full or selective")
    data["attention"] = "flash" if any(f.has(x) for x in FLASH) else "eager"
    return data


def _agree(what: str, flag: str, launch: Any, config: Any) -> None:
    if launch is not None and launch != config:
        raise ConfigError(f"{what} {flag}", f"the launch says {launch}, the DeepSpeed config "
                          f"{config}", "make the two agree")


def import_launch(path: str | Path, *, model: str | None, cluster: str, num_gpus: int | None,
                  assignments: Any = ()) -> Any:  # -> Plan
    """The plan a Megatron-DeepSpeed launch and its DeepSpeed JSON describe."""
    from autoplan.export.importers import _read, deepspeed_plan_dict, finish_plan
    from autoplan.yaml_io import load_json_text

    what = f"deepspeed launch {path}"
    if model is None:
        raise ConfigError("--model", "missing", "a Megatron-DeepSpeed launch names no model "
                          "preset; pass --model")

    def read_config(p: Path, dp: int) -> dict[str, Any]:
        cfg = load_json_text(_read(p, "--deepspeed_config"), f"deepspeed config {p}")
        if not isinstance(cfg, dict):
            raise ConfigError(f"deepspeed config {p}", "expected a JSON object")
        return deepspeed_plan_dict(cfg, dp, f"deepspeed config {p}")

    data = launch_plan_dict(_read(path, "FILE"), Path(path), num_gpus, what, read_config)
    p = data["parallel"]
    data["model"] = model
    data["cluster"] = {"profile": cluster, "num_gpus": p["dp"] * p["tp"] * p["pp"]}
    return finish_plan(data, list(assignments), what)
