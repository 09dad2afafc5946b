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


CUSTOM_BUILDER = "_autoplan_model"


def custom_model_lines(model: ModelSpec) -> tuple[list[str], list[str], list[str]]:
    """(imports, module-level lines, body lines) for a model of torchtitan's Llama 3 architecture
    whose shape has no registered flavor (Llama 2 13B, say): the module builds a Llama3Model
    config at the model's shape the way torchtitan 0.3.0's own flavors do
    (torchtitan/models/llama3/__init__.py: `_build_llama3_layers`, its init tables, the tied 1B's
    skipped embedding init), registers it in `llama3_configs` under the model's name, and points
    the loss and the tokenizer at the model's vocabulary. Those helpers are private to torchtitan
    0.3.0, which the header says. RoPE: the model file carries no base, so torchtitan's default
    (theta 10000, Llama 2's, no scaling) is written out for the user to change."""
    m = model
    name = f"autoplan-{m.name}"
    embed_init = "_EMBEDDING_SKIP_INIT" if m.tie_embeddings else "_EMBEDDING_INIT"
    imports = ["from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
               "from torchtitan.models import llama3",
               "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
               "from torchtitan.models.common.config_utils import decoder_vocab_size",
               "from torchtitan.models.llama3 import config_registry, model_registry"]
    preamble = [
        f"def {CUSTOM_BUILDER}(attn_backend: str, tp_gemm_backend: str = \"default\"):",
        f'    """{m.name} in torchtitan\'s Llama 3 architecture, built as torchtitan 0.3.0 builds '
        'its own flavors (private helpers of llama3/__init__.py)."""',
        f"    dim, vocab, n_heads = {m.hidden_size}, {m.vocab_size}, {m.num_heads}",
        "    return llama3.Llama3Model.Config(",
        "        dim=dim,",
        "        vocab_size=vocab,",
        f"        enable_weight_tying={m.tie_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,",
        f"                                        param_init=llama3.{embed_init}),",
        "        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab,",
        "                              param_init=llama3._output_linear_init(dim)),",
        "        layers=llama3._build_llama3_layers(",
        "            fuse_qkv=True,",
        f"            n_layers={m.num_layers},",
        "            dim=dim,",
        "            n_heads=n_heads,",
        f"            n_kv_heads={m.kv_heads},",
        f"            hidden_dim={m.ffn},",
        "            # RoPE base: autoplan's model file has none; 10000 is Llama 2's, set yours",
        f"            rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len={m.seq_len}, "
        "theta=10000.0),",
        "            attn_backend=attn_backend,",
        "            tp_gemm_backend=tp_gemm_backend,",
        "        ),",
        "    )",
        "",
        "",
        f"llama3.llama3_configs[{name!r}] = {CUSTOM_BUILDER}",
    ]
    body = [
        f"    config.model_spec = model_registry({name!r})",
        "    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(",
        "        global_vocab_size=decoder_vocab_size(config.model_spec)))",
        f"    # the base config's tokenizer is Llama 3's: put one of {m.vocab_size} tokens here",
        f"    config.hf_assets_path = {f'./assets/hf/{m.name}'!r}",
    ]
    return imports, preamble, body


def python_text(
    model: ModelSpec, values: dict[str, dict[str, Any]], found: tuple[str, str], lay: Layout,
    out: str | None = None,
    model_lines: tuple[list[str], list[str], list[str]] | None = None,
) -> str:
    """The config_registry module. `found` is (flavor, config_registry function); a MoE model
    or a Llama 3 architecture without a registered flavor passes `model_lines` (imports,
    module-level lines, body lines setting config.model_spec; torchtitan_moe.py,
    `custom_model_lines`) in place of the registered flavor's."""
    flavor, base = found
    preamble: list[str] = []
    if model_lines is None:
        start = base if base in ("llama3_8b", "llama3_70b", "llama3_405b") else "llama3_8b"
        imports = ["from torchtitan.models.llama3 import config_registry, model_registry"]
        spec = [f"    config.model_spec = model_registry({flavor!r})"]
    else:
        start, (imports, preamble, spec) = base, model_lines
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
        *sorted([*imports, *([f"from torchtitan.distributed.activation_checkpoint import "
                              f"{AC_CLASSES[ac]}"] if ac in AC_CLASSES else [])]),
        "",
        "",
        *([*preamble, "", ""] if preamble else []),
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
