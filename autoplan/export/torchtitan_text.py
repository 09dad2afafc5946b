"""Text of the torchtitan export: a TOML job file (<= 0.2.2) or a config_registry module (>= 0.3).

Both are written from the same section -> field -> value mapping built in `torchtitan.py`.
"""

from __future__ import annotations

import json
import pprint
import shlex
from pathlib import Path
from typing import Any, NamedTuple

from autoplan.export.base import Layout
from autoplan.model_spec import YARN_ROPE_TYPE, ModelSpec
from autoplan.plan import Plan

MODULE = "autoplan_torchtitan"
FUNCTION = "autoplan_plan"


class ModelLines(NamedTuple):
    """What the Python config writes to set config.model_spec: its imports, module-level lines
    (a model builder; none for a registered flavor), the body lines inside autoplan_plan, and a
    header note (empty, or what the reader must know about them)."""

    imports: list[str]
    preamble: list[str]
    body: list[str]
    note: str = ""


class Converters(NamedTuple):
    """model_registry's `converters=` argument as Python text, and the imports it needs."""

    imports: list[str]
    argument: str


def float8_converters(experts: bool) -> Converters:
    """torchtitan 0.3.0's float8 training (components/quantization/float8.py): torchao's
    Float8Linear on every Linear but the output head (Float8LinearConverter; 0.3.0 offers the
    rowwise recipes only), and on a MoE model the experts' grouped GEMMs too
    (Float8GroupedExpertsConverter) with the router gate left 16-bit, as its own
    deepseek_v3_671b_float8 config does. Compile stays off (model_compile_enabled False)."""
    skip = ["lm_head", "router.gate"] if experts else ["lm_head"]
    names = ["Float8LinearConverter"] + (["Float8GroupedExpertsConverter"] if experts else [])
    argument = f"[Float8LinearConverter.Config(filter_fqns={skip!r})"
    argument += ", Float8GroupedExpertsConverter.Config()]" if experts else "]"
    return Converters([f"from torchtitan.components.quantization import {', '.join(names)}"],
                      argument)


def registry_call(args: str, converters: Converters | None) -> str:
    """`model_registry(args)`, with the converters torchtitan applies to the model config."""
    extra = f", converters={converters.argument}" if converters is not None else ""
    return f"model_registry({args}{extra})"


def flavor_lines(flavor: str, converters: Converters | None = None) -> ModelLines:
    """A registered torchtitan Llama 3 flavor."""
    imports = ["from torchtitan.models.llama3 import config_registry, model_registry"]
    return ModelLines(imports + (converters.imports if converters else []), [],
                      [f"    config.model_spec = {registry_call(repr(flavor), converters)}"])


def _in_docstring(text: str) -> str:
    """`text` as it may stand inside a generated triple-quoted docstring (quotes and
    backslashes escaped: a model name is any printable string)."""
    return json.dumps(text)[1:-1]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # a TOML basic string: JSON's escapes of '"', '\\' and the C0 controls are TOML's too,
        # but TOML's \uXXXX must be a Unicode scalar value (no surrogate pairs), so characters
        # outside the BMP stay literal (ensure_ascii=False; names are printable: no DEL)
        return json.dumps(value, ensure_ascii=False)
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
              out: str | None = None, notes: list[str] | None = None) -> str:
    """The TOML job; `notes`: header lines on what the file cannot set (the norms' epsilon)."""
    config_file = shlex.quote(out) if out else "torchtitan.toml"
    lines = [
        f"# torchtitan (<= 0.2.2) job for model {model.name}, written by "
        "`autoplan export --to torchtitan --torchtitan-format toml`.",
        f"# Run: {_torchrun(lay)} -m torchtitan.train --job.config_file {config_file}",
        "# Data, tokenizer, optimizer and step count keep torchtitan's defaults: add them here.",
        *(f"# {line}" for line in notes or []),
        "",
        "[job]",
        f"description = {_toml_value('autoplan plan for ' + model.name)}",
    ]
    first = ("model", "training", "parallelism", "activation_checkpoint")
    for section in (*first, *(name for name in values if name not in first)):
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in values[section].items()]
    return "\n".join(lines) + "\n"


AC_CLASSES = {"full": "FullAC", "selective": "SelectiveAC"}
"""activation_checkpoint.mode -> torchtitan >= 0.3's config class
(torchtitan.distributed.activation_checkpoint)."""


CUSTOM_BUILDER = "_autoplan_model"


def _rope_scaling_args(m: ModelSpec) -> str:
    """ComplexRoPE.Config's scaling arguments (torchtitan 0.3.0 models/common/rope.py):
    scaling="llama" with scaling_factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings; scaling="yarn" with rope_factor, beta_fast, beta_slow,
    original_seq_len, truncate (_yarn_inv_freq: a pure rotation, so only a YaRN that scales
    neither cos/sin nor the softmax passes torchtitan.yarn_reasons); or nothing: its default
    is scaling="none"."""
    s = m.rope_scaling
    if s is None:
        return ""
    if s.rope_type == YARN_ROPE_TYPE:
        return (f', scaling="yarn", rope_factor={s.factor!r}, beta_fast={s.beta_fast!r}, '
                f"beta_slow={s.beta_slow!r}, "
                f"original_seq_len={s.original_max_position_embeddings}, truncate={s.truncate}")
    return (f', scaling="llama", scaling_factor={s.factor!r}, '
            f"low_freq_factor={s.low_freq_factor!r}, high_freq_factor={s.high_freq_factor!r}, "
            f"original_max_position_embeddings={s.original_max_position_embeddings}")


LLAMA3_NORM_EPS = 1e-5
"""RMSNorm.Config's default epsilon (torchtitan 0.3.0 models/common/nn_modules.py), which
_build_llama3_layers leaves on every block norm."""


def _eps_arg(m: ModelSpec) -> str:
    return "" if m.norm_eps == LLAMA3_NORM_EPS else f", eps={m.norm_eps!r}"


def _eps_lines(m: ModelSpec) -> list[str]:
    """The block norms at the model's epsilon where it is not the builder's (its configs are
    mutable dataclasses: TransformerBlock.Config's attention_norm and ffn_norm)."""
    if m.norm_eps == LLAMA3_NORM_EPS:
        return []
    return ["    for layer in layers:  # the model's norm_eps, not RMSNorm.Config's 1e-5",
            f"        layer.attention_norm.eps = layer.ffn_norm.eps = {m.norm_eps!r}"]


def custom_model_lines(model: ModelSpec, converters: Converters | None = None) -> ModelLines:
    """(imports, module-level lines, body lines) for a model of torchtitan's Llama 3 architecture
    whose shape has no registered flavor (Llama 2 13B, say): the module builds a Llama3Model
    config at the model's shape the way torchtitan 0.3.0's own flavors do
    (torchtitan/models/llama3/__init__.py: `_build_llama3_layers`, its init tables, the tied 1B's
    skipped embedding init), registers it in `llama3_configs` under the model's name, and points
    the loss and the tokenizer at the model's vocabulary. Those helpers are private to torchtitan
    0.3.0, which the header note says. RoPE at the model's rope_theta and scaling; the
    attention is full causal attention, as autoplan plans it (no sliding window)."""
    m = model
    name = f"autoplan-{m.name}"
    embed_init = "_EMBEDDING_SKIP_INIT" if m.tie_embeddings else "_EMBEDDING_INIT"
    imports = ["from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
               "from torchtitan.models import llama3",
               "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
               "from torchtitan.models.common.config_utils import decoder_vocab_size",
               "from torchtitan.models.llama3 import config_registry, model_registry",
               *(converters.imports if converters else [])]
    preamble = [
        f"def {CUSTOM_BUILDER}(attn_backend: str, tp_gemm_backend: str = \"default\"):",
        f'    """{_in_docstring(m.name)} in torchtitan\'s Llama 3 architecture, built as',
        '    torchtitan 0.3.0 builds its own flavors (private helpers of llama3/__init__.py)."""',
        f"    dim, vocab, n_heads = {m.hidden_size}, {m.vocab_size}, {m.num_heads}",
        "    layers = llama3._build_llama3_layers(",
        "        fuse_qkv=True,",
        f"        n_layers={m.num_layers},",
        "        dim=dim,",
        "        n_heads=n_heads,",
        f"        n_kv_heads={m.kv_heads},",
        f"        hidden_dim={m.ffn},",
        f"        rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len={m.seq_len}, "
        f"theta={m.rope_theta!r}{_rope_scaling_args(m)}),",
        "        attn_backend=attn_backend,",
        "        tp_gemm_backend=tp_gemm_backend,",
        "    )",
        *_eps_lines(m),
        "    return llama3.Llama3Model.Config(",
        "        dim=dim,",
        "        vocab_size=vocab,",
        f"        enable_weight_tying={m.tie_embeddings},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,",
        f"                                        param_init=llama3.{embed_init}),",
        f"        norm=RMSNorm.Config(normalized_shape=dim{_eps_arg(m)}, "
        "param_init=llama3._NORM_INIT),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab,",
        "                              param_init=llama3._output_linear_init(dim)),",
        "        layers=layers,",
        "    )",
        "",
        "",
        f"llama3.llama3_configs[{name!r}] = {CUSTOM_BUILDER}",
    ]
    body = [
        f"    config.model_spec = {registry_call(repr(name), converters)}",
        "    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(",
        "        global_vocab_size=decoder_vocab_size(config.model_spec)))",
        f"    # the base config's tokenizer is Llama 3's: put one of {m.vocab_size} tokens here",
        f"    config.hf_assets_path = {f'./assets/hf/{m.name}'!r}",
    ]
    note = ("The model is defined below at its own shape and RoPE base with torchtitan "
            "0.3.0's private builders\n(llama3/__init__.py); set its tokenizer "
            "(hf_assets_path) for your model.")
    return ModelLines(imports, preamble, body, note)


def python_text(
    model: ModelSpec, values: dict[str, dict[str, Any]], base: str, lay: Layout,
    out: str | None, lines_for_model: ModelLines,
) -> str:
    """The config_registry module: `base`, the config_registry function it starts from (its
    data, tokenizer, optimizer and step count), then `lines_for_model` (a registered flavor,
    torchtitan_moe's MoE flavor, or `custom_model_lines`) and the plan's settings."""
    imports, preamble, spec, note = lines_for_model
    ac = values["activation_checkpoint"]["mode"]
    pythonpath, module = module_name(out)
    saved = "" if out else f" (save this file as {MODULE}.py)"
    lines = [
        f'"""torchtitan (>= 0.3) config for model {_in_docstring(model.name)}, written by '
        "`autoplan export`.",
        "",
        f"Run{saved}: PYTHONPATH={pythonpath} {_torchrun(lay)} -m torchtitan.train "
        f"--module {module} --config {FUNCTION}",
        f"Data, tokenizer, optimizer and step count come from the base config ({base}): "
        "change them here.",
        *(_in_docstring(line) for line in note.splitlines()),
        '"""',
        "",
        *sorted([*imports, "from torchtitan.config import CompileConfig",
                 *([f"from torchtitan.distributed.activation_checkpoint import "
                    f"{AC_CLASSES[ac]}"] if ac in AC_CLASSES else [])]),
        "",
        "",
        *([*preamble, "", ""] if preamble else []),
        f"def {FUNCTION}():",
        f"    config = config_registry.{base}()",
        *spec,
    ]
    for section in ("training", "parallelism"):
        for key, value in values[section].items():
            text = pprint.pformat(value, width=80, compact=True).replace("\n", "\n        ")
            lines.append(f"    config.{section}.{key} = {text}")
    # eager, as the torchtitan runtime prices it: a base may compile (0.3.0's llama3_405b:
    # CompileConfig(enable=True, enable_async_tensor_parallel=True); deepseek_v3's the loss)
    lines.append("    config.compile = CompileConfig()")
    if ac in AC_CLASSES:  # selective: op-level SAC (SelectiveAC's default save list)
        lines.append(f"    config.activation_checkpoint = {AC_CLASSES[ac]}.Config()")
    else:
        lines.append("    config.activation_checkpoint = None")
    lines.append("    return config")
    return "\n".join(lines) + "\n"
