"""Model specifications: the shape of a decoder-only transformer, built-in presets and import of
a local Hugging Face `config.json` (no network, no transformers import).

Parameter counting lives in `autoplan.cost.params`; this module only describes shapes.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_presets import PRESET_NORMS, dense_presets
from autoplan.moe_spec import MLASpec, MoESpec, moe_presets

# RoPE scaling lives in autoplan.rope_scaling; its names stay importable from here (as X as X)
from autoplan.rope_scaling import DEEPSEEK_V3_ROPE_SCALING as DEEPSEEK_V3_ROPE_SCALING
from autoplan.rope_scaling import GPT_OSS_ROPE_SCALING as GPT_OSS_ROPE_SCALING
from autoplan.rope_scaling import LLAMA3_ROPE_TYPE as LLAMA3_ROPE_TYPE
from autoplan.rope_scaling import LLAMA31_ROPE_SCALING as LLAMA31_ROPE_SCALING
from autoplan.rope_scaling import ROPE_FIELDS as ROPE_FIELDS
from autoplan.rope_scaling import YARN_ROPE_TYPE as YARN_ROPE_TYPE
from autoplan.rope_scaling import RopeScaling as RopeScaling
from autoplan.rope_scaling import yarn_mscale as yarn_mscale
from autoplan.yaml_io import check_schema_version, from_dict, name_hint, read_yaml, show


class MlpKind(str, enum.Enum):
    GELU = "gelu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"


GATED_MLPS = (MlpKind.SWIGLU, MlpKind.GEGLU)
"""MLPs with three matrices: gate and up (fused as one 2f-wide GEMM in cost.compute), then down."""

MAX_SIZE = {
    "num_layers": 2**16, "hidden_size": 2**20, "num_heads": 2**16, "num_kv_heads": 2**16,
    "head_dim": 2**16, "ffn_hidden_size": 2**22, "vocab_size": 2**24, "seq_len": 2**24,
}
"""Largest value of each size field. Far past any published model (Llama 3.1 405B: 126 layers,
h 16384, ffn 53248, vocab 128256) yet small enough that the products the cost model forms
(V*h and L*h*ffn in int64, s^2*h*L*B in float64) cannot overflow."""
DEFAULT_ROPE_THETA = 10000.0
"""RoPE base of Su et al. 2021 (RoFormer) and Llama 2, and Megatron's --rotary-base default."""
MAX_ROPE_THETA = 1e9
"""Largest rope_theta: past any published base (Llama 3: 5e5; Qwen2.5-1M: 1e7)."""
DEFAULT_NORM_EPS = 1e-5
"""The norms' epsilon before norm_eps was a field (the runtime's, Megatron's --norm-epsilon
default, GPT-2's and Llama 2/3's configs); Qwen3, DeepSeek-V3 and Gemma use 1e-6."""
MAX_NORM_EPS = 0.1
"""Largest norm_eps: far past any published value (1e-5 to 1e-6), so a slip such as 1 or 1e5
(which would wash out the normalisation) is refused."""

class NormKind(str, enum.Enum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class PositionKind(str, enum.Enum):
    LEARNED = "learned"
    ROPE = "rope"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory, FLOPs and the runtime need to know it."""

    name: str
    """Identifier shown in tables and written into plans."""
    num_layers: int
    """Transformer blocks (L)."""
    hidden_size: int
    """Model width (h)."""
    num_heads: int
    """Attention (query) heads (a)."""
    vocab_size: int
    """Vocabulary size (V) as the tokenizer defines it; runtimes pad it, see cost.params."""
    seq_len: int
    """Training sequence length in tokens (s)."""
    num_kv_heads: int | None = None
    """Key/value heads; fewer than num_heads is grouped-query attention. Default: num_heads."""
    ffn_hidden_size: int | None = None
    """MLP inner width. Default: 4 * hidden_size."""
    mlp: MlpKind = MlpKind.GELU
    """gelu: two matrices (GPT); swiglu: three matrices, gate and up (Llama); geglu: the same
    three with GELU on the gate (Gemma; Shazeer 2020, "GLU Variants Improve Transformer")."""
    norm: NormKind = NormKind.LAYERNORM
    """layernorm (weight and bias) or rmsnorm (weight only)."""
    position: PositionKind = PositionKind.LEARNED
    """learned: a seq_len x hidden position table (GPT); rope: rotary, no parameters (Llama)."""
    bias: bool = True
    """Linear layers carry biases (GPT) or not (Llama)."""
    qkv_bias: bool = False
    """With bias false, the query, key and value projections alone carry biases, the output
    projection and the MLP none: Qwen2 (HF Qwen2Attention builds q_proj, k_proj and v_proj with
    bias=True and o_proj with bias=False whatever the config says; Qwen2-MoE's `qkv_bias`,
    default true), Megatron's `--disable-bias-linear --add-qkv-bias`. bias true already puts
    biases on every Linear, q, k and v included."""
    qk_norm: bool = False
    """q and k are normalised per head after their projections, before RoPE: an RMSNorm over
    head_dim with its own weight of head_dim, one for q and one for k, shared by the heads
    (Qwen3 and Qwen3-MoE: HF Qwen3Attention's q_norm / k_norm; Megatron's --qk-layernorm,
    torchtitan's qwen3 qk_norm). RMSNorm models only; not with latent attention (mla), whose
    latent norms are part of it."""
    norm_eps: float = DEFAULT_NORM_EPS
    """Epsilon of every norm (the blocks', the final one, qk_norm's and MLA's latent ones):
    HF `rms_norm_eps` / `layer_norm_eps`, Megatron --norm-epsilon. No figure of the cost model
    depends on it."""
    tie_embeddings: bool = False
    """The output projection shares the input embedding's weights."""
    dropout: float = 0.0
    """Dropout probability after attention and MLP (and on attention probabilities)."""
    head_dim: int | None = None
    """Width of one attention head; the query projection is num_heads * head_dim wide (and K, V
    num_kv_heads * head_dim). Default: hidden_size / num_heads. Gemma and Qwen3 set it apart."""
    moe: MoESpec | None = None
    """Routed experts (autoplan.moe_spec); None: every block has the dense MLP."""
    mla: MLASpec | None = None
    """Multi-head latent attention (autoplan.moe_spec); None: standard (grouped-query)
    attention. With MLA, head_dim is the attention core's mean width (qk + v) / 2."""
    mtp_layers: int = 0
    """Multi-token prediction depth D (DeepSeek-V3 report §2.2; HF `num_nextn_predict_layers`,
    Megatron --mtp-num-layers): each depth adds one block after the last (of the kind block
    num_layers + d would be), a 2h -> h projection of [norm(h); norm(embedding)] and two
    RMSNorms, shares the embedding and the output head, and adds a cross-entropy loss on the
    last pipeline stage. Its parameters are counted apart from the main model's
    (cost.params.mtp_params). 0: none."""
    rope_theta: float = DEFAULT_ROPE_THETA
    """RoPE base: position p rotates pair i by p * theta^(-2i/d) (Su et al. 2021; HF
    `rope_theta`, Megatron --rotary-base). Llama 2: 10000, Llama 3: 500000. Only with position
    rope."""
    rope_scaling: RopeScaling | None = None
    """How the rotation scales its frequencies (RopeScaling): Llama 3.1's (rope_type llama3) or
    YaRN (yarn: DeepSeek-V3, gpt-oss); None: none. Only with position rope."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isprintable() or not self.name.strip():
            raise ConfigError("model.name", f"got {show(self.name)}", "expected a printable name")
        if len(self.name) > 200:
            raise ConfigError("model.name", f"got {show(self.name)}", "expected <= 200 characters")
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_len"):
            _positive(f"model.{name}", getattr(self, name))
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        _positive("model.num_kv_heads", self.num_kv_heads)
        _positive("model.ffn_hidden_size", self.ffn_hidden_size)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    "model.num_heads",
                    f"{self.num_heads} does not divide hidden_size={self.hidden_size}",
                    "choose a divisor of hidden_size, or give head_dim",
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _positive("model.head_dim", self.head_dim)
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or not (
                0 <= self.mtp_layers <= self.num_layers):
            raise ConfigError("model.mtp_layers", f"got {show(self.mtp_layers)}",
                              f"expected an integer from 0 to num_layers={self.num_layers}")
        if self.moe is not None and self.moe.first_dense_layers >= self.num_layers:
            raise ConfigError("model.moe.first_dense_layers",
                              f"{self.moe.first_dense_layers} leaves none of the "
                              f"{self.num_layers} blocks a MoE block",
                              f"choose fewer than num_layers={self.num_layers}, or drop moe")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("model.dropout", f"got {self.dropout!r}", "expected 0 <= dropout < 1")
        _check_qkv_bias(self)
        _check_qk_norm(self)
        _check_norm_eps(self.norm_eps)
        object.__setattr__(self, "norm_eps", float(self.norm_eps))
        _check_rope_theta(self.rope_theta, self.position)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.rope_scaling is not None and self.position != PositionKind.ROPE:
            raise ConfigError("model.rope_scaling", f"set with position={self.position.value}",
                              "set position: rope, or drop rope_scaling")
        if (self.rope_scaling is not None and self.rope_scaling.rope_type == YARN_ROPE_TYPE
                and self.rope_theta <= 1.0):  # YaRN's ramp divides by ln(rope_theta)
            raise ConfigError("model.rope_theta", f"{self.rope_theta:g} with rope_scaling yarn",
                              "YaRN needs a base above 1 (DeepSeek-V3: 10000)")
        assert self.num_kv_heads is not None
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "model.num_kv_heads",
                f"{self.num_kv_heads} does not divide num_heads={self.num_heads}",
                "choose a divisor of num_heads",
            )

    @property
    def head_width(self) -> int:
        """head_dim, typed as int (it is resolved in __post_init__)."""
        assert self.head_dim is not None
        return self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the query projection (and the attention output): num_heads * head_dim."""
        return self.num_heads * self.head_width

    @property
    def gated_mlp(self) -> bool:
        """Three MLP matrices (SwiGLU, GeGLU) rather than two (GELU)."""
        return self.mlp in GATED_MLPS

    @property
    def kv_heads(self) -> int:
        """num_kv_heads, typed as int (it is resolved in __post_init__)."""
        assert self.num_kv_heads is not None
        return self.num_kv_heads

    @property
    def ffn(self) -> int:
        """ffn_hidden_size, typed as int (it is resolved in __post_init__)."""
        assert self.ffn_hidden_size is not None
        return self.ffn_hidden_size

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)


def _positive(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(field, f"got {show(value)}", "expected a positive integer")
    high = MAX_SIZE[field.removeprefix("model.")]
    if value > high:
        raise ConfigError(field, f"got {show(value)}", f"expected at most 2**{high.bit_length() - 1}")


def _check_qkv_bias(spec: ModelSpec) -> None:
    if not isinstance(spec.qkv_bias, bool):
        raise ConfigError("model.qkv_bias", f"got {show(spec.qkv_bias)}", "expected true or false")
    if spec.qkv_bias and spec.bias:  # one spelling per model (hashes, exports)
        raise ConfigError("model.qkv_bias", "true with bias: true", "bias: true already puts "
                          "biases on q, k and v (and every other Linear): drop qkv_bias, or "
                          "set bias: false for q, k and v biases alone")
    if spec.qkv_bias and spec.mla is not None:
        raise ConfigError("model.qkv_bias", "true with mla", "latent attention has no q, k and "
                          "v projections of that shape: drop qkv_bias")


def _check_qk_norm(spec: ModelSpec) -> None:
    if not isinstance(spec.qk_norm, bool):
        raise ConfigError("model.qk_norm", f"got {show(spec.qk_norm)}", "expected true or false")
    if spec.qk_norm and spec.mla is not None:
        raise ConfigError("model.qk_norm", "true with mla", "latent attention normalises its "
                          "latents instead (its q_norm and kv_norm are built with it): drop "
                          "qk_norm")
    if spec.qk_norm and spec.norm != NormKind.RMSNORM:
        norm = getattr(spec.norm, "value", spec.norm)
        raise ConfigError("model.qk_norm", f"true with norm {norm}", "autoplan normalises q "
                          "and k with RMSNorm (Qwen3's): set norm: rmsnorm, or drop qk_norm")


def _check_norm_eps(eps: Any) -> None:
    if (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps)
            or not 0.0 < eps <= MAX_NORM_EPS):
        raise ConfigError("model.norm_eps", f"got {show(eps)}",
                          f"expected a number in (0, {MAX_NORM_EPS:g}], e.g. 1e-5 or 1e-6")


def _check_rope_theta(theta: Any, position: PositionKind) -> None:
    if (isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta)
            or not 0.0 < theta <= MAX_ROPE_THETA):
        raise ConfigError("model.rope_theta", f"got {show(theta)}",
                          f"expected a number in (0, {MAX_ROPE_THETA:g}]")
    if theta != DEFAULT_ROPE_THETA and position != PositionKind.ROPE:
        raise ConfigError("model.rope_theta", f"{theta:g} with position="
                          f"{getattr(position, 'value', position)}",
                          "set position: rope, or drop rope_theta")


OMITTED_AT_DEFAULT = {"rope_theta": DEFAULT_ROPE_THETA, "rope_scaling": None, "qkv_bias": False,
                      "qk_norm": False, "norm_eps": DEFAULT_NORM_EPS}
"""ModelSpec fields added after files were first written, left out of a saved mapping at their
defaults (model_dict)."""
UNPRICED = ("rope_theta", "rope_scaling", "norm_eps")
"""OMITTED_AT_DEFAULT fields no figure of the cost model depends on (a stored study's hash
leaves them out whatever their value); qkv_bias and qk_norm change the parameter count."""


def model_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A saved ModelSpec mapping (yaml_io.to_dict) without the fields of OMITTED_AT_DEFAULT at
    their defaults (rope_theta, rope_scaling, qkv_bias, qk_norm, norm_eps), so that model files,
    plans, checkpoints and studies written before those fields read back the same; rope_scaling
    keeps only its kind's fields (the others are None)."""
    out = {k: v for k, v in data.items()
           if not (k in OMITTED_AT_DEFAULT and v == OMITTED_AT_DEFAULT[k])}
    if isinstance(out.get("rope_scaling"), dict):
        out["rope_scaling"] = {k: v for k, v in out["rope_scaling"].items() if v is not None}
    return out


PRESETS: dict[str, ModelSpec] = {m.name: m for m in dense_presets()}
"""The built-in models by name: model_presets' dense ones, then moe_spec's MoE ones
with their norm fields (model_presets.PRESET_NORMS)."""
PRESETS.update((m.name, m) for m in moe_presets())  # Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss
PRESETS.update((name, PRESETS[name].replace(**norms)) for name, norms in PRESET_NORMS.items())


def from_hf_config(path: str | Path, field: str = "--model",
                   seq_len: int | None = None) -> ModelSpec:
    """Read a local Hugging Face `config.json`; see `autoplan.model_hf` for the families."""
    from autoplan.model_hf import from_hf_config as read

    return read(path, field, seq_len)


def _is_file(ref: str) -> bool:
    try:
        return Path(ref).is_file()
    except OSError:  # e.g. a name past NAME_MAX: read_yaml says so
        return True


def _is_dir(ref: str) -> bool:
    try:
        return Path(ref).is_dir()
    except OSError:  # a name past NAME_MAX is no folder: the file reader says what it is
        return False


def load_model(ref: str | dict[str, Any] | ModelSpec, field: str = "--model",
               seq_len: int | None = None) -> ModelSpec:
    """A preset name, a path to a YAML spec or config.json, or an inline mapping; `field` is
    where the reference was given (`--model`, or `model` in a plan), for errors; `seq_len`
    replaces the model's training sequence length (`--seq-len`)."""
    if isinstance(ref, str) and ref not in PRESETS and _is_dir(ref):
        # a Hugging Face model folder, as a user downloads one: its config.json
        if not (Path(ref) / "config.json").is_file():
            raise ConfigError(field, f"{show(ref, 100)} is a folder without a config.json",
                              "give a preset, a model YAML, or a Hugging Face config.json "
                              "or the folder that holds one")
        return from_hf_config(str(Path(ref) / "config.json"), field, seq_len)
    if isinstance(ref, str) and ref not in PRESETS and ref.endswith(".json"):
        return from_hf_config(ref, field, seq_len)  # which says when it guessed the length
    model = _load(ref, field)
    return model if seq_len is None else model.replace(seq_len=seq_len)


def _load(ref: str | dict[str, Any] | ModelSpec, field: str) -> ModelSpec:
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, dict):
        return from_dict(ModelSpec, check_schema_version(ref, "model"), "model")
    if ref in PRESETS:
        return PRESETS[ref]
    if ref.endswith((".yaml", ".yml")) or _is_file(ref):
        data = read_yaml(ref, field)
        if not isinstance(data, dict):
            raise ConfigError(f"{field} {ref}", "expected a mapping of model fields")
        return from_dict(ModelSpec, check_schema_version(data, "model"), "model")
    hint = name_hint(ref, PRESETS)
    raise ConfigError(
        field, f"unknown model {show(ref, 100)}",
        (f"{hint} " if hint else "")
        + f"choose a preset ({', '.join(PRESETS)}) or a path to a YAML spec, a config.json "
        "or the folder that holds one",
    )
