"""RoPE scaling, the optional part of a rotary ModelSpec: Llama 3.1's and YaRN's (RopeScaling),
the presets that rotate with them, and the one effect and one description that every export,
importer and checkpoint compares and names them by. The runtime applies them
(runtime/models/layers.py); the cost model does not read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from autoplan.errors import ConfigError
from autoplan.yaml_io import show

LLAMA3_ROPE_TYPE = "llama3"
"""Llama 3.1's RoPE scaling, by frequency band (HF rope_type "llama3")."""
YARN_ROPE_TYPE = "yarn"
"""YaRN (Peng et al. 2023, arXiv 2309.00071): DeepSeek-V3's and gpt-oss's (HF rope_type "yarn")."""
ROPE_FIELDS = {
    LLAMA3_ROPE_TYPE: ("factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings"),
    YARN_ROPE_TYPE: ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                     "mscale", "mscale_all_dim", "attention_factor", "truncate"),
}
"""The fields each rope_type takes (a file gives rope_type and only these)."""
REQUIRED_FIELDS = {
    LLAMA3_ROPE_TYPE: ROPE_FIELDS[LLAMA3_ROPE_TYPE],
    YARN_ROPE_TYPE: ("factor", "original_max_position_embeddings"),
}
"""The fields a scaling of each kind must have: llama3's four (a config.json gives all four,
transformers' _validate_llama3_parameters; a model file may leave them at Llama 3.1's), yarn's
factor and original window (no default)."""
_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMA3_ROPE_TYPE: {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192},
    YARN_ROPE_TYPE: {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True},
}
"""Llama 3.1's values (llama3), HF _compute_yarn_parameters' defaults (yarn: `beta_fast or 32`,
`beta_slow or 1`, truncate True); yarn's factor and original window have none."""
_EXPECTED = {"original_max_position_embeddings": "expected an integer",
             "truncate": "expected true or false"}
"""What a field other than a number expects, for the error on an explicit null."""


class _Unset:
    """A field the caller did not give (its kind's default applies); None is an explicit null."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1, 1 at factor <= 1 (YaRN eq. 21;
    HF transformers' yarn_get_mscale, DeepSeek-V3 inference/model.py, Megatron-Core
    _yarn_get_mscale)."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


class RopeEffect(NamedTuple):
    """What a scaling does, the terms two scalings are the same rotation by (same_rotation): the
    frequencies' parameters of its kind, and what cos/sin and the softmax scale are multiplied
    by (YaRN's mscales however spelled: HF's mscale = mscale_all_dim = 1 is torchtitan's
    attention mscale 1.0 and Megatron's --mscale 1 --mscale-all-dim 1)."""

    rope_type: str
    frequencies: tuple[Any, ...]
    """llama3: factor, low, high, original; yarn: factor, original, beta_fast, beta_slow,
    truncate."""
    cos_sin: float
    softmax: float


@dataclass(frozen=True)
class RopeScaling:
    """How a rotary model scales its frequencies past its pre-training window; `rope_type`
    says which of two kinds, and a file gives only that kind's fields (ROPE_FIELDS): another
    kind's field is refused, an explicit null for a field with a default too, and a saved
    mapping leaves the unused ones (None) out (model_spec.model_dict). One class with a
    discriminating rope_type, not a class per kind, because the loader builds a field's
    dataclass from its annotation: one class keeps every error one line that names the field,
    and Llama 3.1 files written before YaRN existed read (and save) unchanged.

    llama3 (Llama 3.1; HF rope_type "llama3"; Meta's llama-models `apply_scaling`; torchtitan's
    RoPEScalingArgs; Megatron --use-rope-scaling): each pair's frequency f (wavelength 2*pi/f)
    is kept where the wavelength is shorter than original_max_position_embeddings /
    high_freq_factor, divided by `factor` where longer than original / low_freq_factor, and
    blended linearly between: s = (original / wavelength - low) / (high - low),
    f' = (1 - s) f / factor + s f. Llama 3.1 and 3.2: factor 8 (3.2: 32), low 1, high 4, 8192.

    yarn (HF transformers `_compute_yarn_parameters`; DeepSeek-V3 inference/model.py
    `precompute_freqs_cis`): pair i's frequency is divided by `factor` by a linear ramp over
    the pair indices whose wavelength turns between beta_fast and beta_slow times in the
    original window (0 below the first: kept; 1 past the last: divided); `truncate` floors and
    ceils the ramp's ends (DeepSeek, HF's default) or keeps them fractional (gpt-oss). Two
    magnitude conventions follow HF: cos and sin are multiplied by `attention_scaling`
    (attention_factor, else yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    where both are given, else yarn_mscale(factor): gpt-oss's 1.347), and with mscale_all_dim
    the softmax scale by `softmax_gain` = yarn_mscale(factor, mscale_all_dim)^2 (DeepSeek's MLA:
    its reference and torchtitan's deepseek_v3 multiply the softmax scale by mscale^2 and leave
    cos/sin unscaled, which is this rule where mscale == mscale_all_dim). DeepSeek-V3: factor 40,
    original 4096, beta 32/1, mscale = mscale_all_dim = 1; gpt-oss: factor 32, original 4096,
    truncate false. Either kind changes only the rotation and the attention's scale, no cost:
    the cost model does not read it."""

    factor: float | None = _UNSET
    low_freq_factor: float | None = _UNSET
    high_freq_factor: float | None = _UNSET
    original_max_position_embeddings: int | None = _UNSET
    rope_type: str = LLAMA3_ROPE_TYPE
    """llama3 (the default, as files before yarn) or yarn."""
    beta_fast: float | None = _UNSET
    beta_slow: float | None = _UNSET
    mscale: float | None = _UNSET
    mscale_all_dim: float | None = _UNSET
    attention_factor: float | None = _UNSET
    truncate: bool | None = _UNSET

    def __post_init__(self) -> None:
        kind = self.rope_type
        if kind not in ROPE_FIELDS:
            raise ConfigError("model.rope_scaling.rope_type", f"got {show(kind)}",
                              f"choose {LLAMA3_ROPE_TYPE} (Llama 3.1's) or {YARN_ROPE_TYPE} "
                              "(DeepSeek-V3's, gpt-oss's), or drop rope_scaling to rotate "
                              "without scaling")
        own = ROPE_FIELDS[kind]
        for name in sorted(set().union(*ROPE_FIELDS.values()) - set(own)):
            self._refuse_foreign(name, kind)
        for name in own:
            value = getattr(self, name)
            if value is _UNSET:
                object.__setattr__(self, name, _DEFAULTS[kind].get(name))
            elif value is None and (name in _DEFAULTS[kind] or name in REQUIRED_FIELDS[kind]):
                raise ConfigError(f"model.rope_scaling.{name}", "got None (null)",
                                  _EXPECTED.get(name, "expected a number"))
        for name in REQUIRED_FIELDS[kind]:
            if getattr(self, name) is None:
                raise ConfigError(f"model.rope_scaling.{name}", f"missing with rope_type {kind}",
                                  f"add '{name}:' (DeepSeek-V3: factor 40, original 4096)")
        self._check_numbers(own)
        window = self.original_max_position_embeddings
        if isinstance(window, bool) or not isinstance(window, int) or not 0 < window <= 2**24:
            raise ConfigError("model.rope_scaling.original_max_position_embeddings",
                              f"got {show(window)}", "expected a positive integer up to 2**24")
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise ConfigError("model.rope_scaling.truncate", f"got {show(self.truncate)}",
                              "expected true or false")

    def _refuse_foreign(self, name: str, kind: str) -> None:
        """Another kind's field: absent or null is none; a value likely means that kind."""
        value = getattr(self, name)
        if value is _UNSET or value is None:
            object.__setattr__(self, name, None)
            return
        owner = next(k for k, names in ROPE_FIELDS.items() if name in names)
        raise ConfigError(f"model.rope_scaling.{name}", f"given with rope_type {kind}",
                          f"set rope_type: {owner} (its field), or drop it: rope_type {kind} "
                          f"takes {', '.join(ROPE_FIELDS[kind])}")

    def _check_numbers(self, own: tuple[str, ...]) -> None:
        for name in own:
            value = getattr(self, name)
            if value is None or name in ("original_max_position_embeddings", "truncate"):
                continue
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not 0.0 < value <= 1e6):
                raise ConfigError(f"model.rope_scaling.{name}", f"got {show(value)}",
                                  "expected a number in (0, 1e6]")
            object.__setattr__(self, name, float(value))
        assert self.factor is not None
        if self.factor < 1.0:
            raise ConfigError("model.rope_scaling.factor", f"got {self.factor:g}",
                              "expected at least 1 (it divides the low frequencies)")
        if self.rope_type == LLAMA3_ROPE_TYPE:
            assert self.high_freq_factor is not None and self.low_freq_factor is not None
            if self.high_freq_factor <= self.low_freq_factor:
                raise ConfigError("model.rope_scaling.high_freq_factor",
                                  f"{self.high_freq_factor:g} is not above low_freq_factor="
                                  f"{self.low_freq_factor:g}",
                                  "the blend runs from low_freq_factor up to high_freq_factor "
                                  "(Llama 3.1: 1 and 4)")
        elif self.beta_fast is not None and self.beta_slow is not None and (
                self.beta_fast <= self.beta_slow):
            raise ConfigError("model.rope_scaling.beta_fast", f"{self.beta_fast:g} is not above "
                              f"beta_slow={self.beta_slow:g}",
                              "the ramp runs from beta_fast turns down to beta_slow (32 and 1)")

    @property
    def attention_scaling(self) -> float:
        """What YaRN multiplies cos and sin by (HF `_compute_yarn_parameters`' attention_factor;
        Megatron-Core's concentration factor); 1 for llama3."""
        if self.rope_type != YARN_ROPE_TYPE:
            return 1.0
        assert self.factor is not None
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor,
                                                                        self.mscale_all_dim)
        return yarn_mscale(self.factor)

    @property
    def softmax_gain(self) -> float:
        """What YaRN multiplies the softmax scale 1/sqrt(d) by: yarn_mscale(factor,
        mscale_all_dim)^2 where mscale_all_dim is given (HF `yarn_apply_mscale`; DeepSeek-V3's
        MLA), else 1."""
        if self.rope_type != YARN_ROPE_TYPE or not self.mscale_all_dim:
            return 1.0
        assert self.factor is not None
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2

    def effect(self) -> RopeEffect | None:
        """What this scaling does (RopeEffect), magnitudes to 12 digits; None where it does
        nothing (factor 1 divides no frequency, and cos/sin and the softmax keep their scale):
        the same as no scaling."""
        cos_sin, softmax = round(self.attention_scaling, 12), round(self.softmax_gain, 12)
        if self.factor == 1.0 and cos_sin == 1.0 and softmax == 1.0:
            return None
        kept = ("beta_fast", "beta_slow", "truncate") if self.rope_type == YARN_ROPE_TYPE else (
            "low_freq_factor", "high_freq_factor")
        return RopeEffect(self.rope_type, (self.factor, self.original_max_position_embeddings,
                                           *(getattr(self, k) for k in kept)), cos_sin, softmax)

    def describe(self) -> str:
        """The scaling in words, its kind's fields as a file spells them (and YaRN's magnitudes):
        "Llama 3.1's scaling (factor 8, low_freq_factor 1, ...)", "YaRN scaling (factor 40,
        ...; cos/sin x1, softmax x1.874)"."""
        fields = field_words({k: getattr(self, k) for k in ROPE_FIELDS[self.rope_type]
                              if k not in ("mscale", "mscale_all_dim", "attention_factor")})
        if self.rope_type != YARN_ROPE_TYPE:
            return f"Llama 3.1's scaling ({fields})"
        return (f"YaRN scaling ({fields}; cos/sin x{self.attention_scaling:.4g}, softmax "
                f"x{self.softmax_gain:.4g})")


def field_words(fields: dict[str, Any]) -> str:
    """"name value, ..." of RopeScaling fields as a file writes them (true/false, numbers %g);
    None ones left out."""
    return ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else format(v, 'g')}"
                     for k, v in fields.items() if v is not None)


def scaling_words(s: RopeScaling | None) -> str:
    """RopeScaling.describe(), or "no scaling"."""
    return "no scaling" if s is None else s.describe()


def same_rotation(a: RopeScaling | None, b: RopeScaling | None) -> bool:
    """Two scalings (None: none) that rotate and scale attention alike (RopeScaling.effect)."""
    return (None if a is None else a.effect()) == (None if b is None else b.effect())


LLAMA31_ROPE_SCALING = RopeScaling()
"""meta-llama/Llama-3.1-8B (and 70B, 405B) config.json rope_scaling: factor 8.0,
low_freq_factor 1.0, high_freq_factor 4.0, original_max_position_embeddings 8192."""
DEEPSEEK_V3_ROPE_SCALING = RopeScaling(rope_type=YARN_ROPE_TYPE, factor=40.0,
                                       original_max_position_embeddings=4096, beta_fast=32.0,
                                       beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
"""deepseek-ai/DeepSeek-V3 config.json rope_scaling: type yarn, factor 40, original 4096,
beta_fast 32, beta_slow 1, mscale 1.0, mscale_all_dim 1.0 (truncate: HF's default, true)."""
GPT_OSS_ROPE_SCALING = RopeScaling(rope_type=YARN_ROPE_TYPE, factor=32.0,
                                   original_max_position_embeddings=4096, beta_fast=32.0,
                                   beta_slow=1.0, truncate=False)
"""openai/gpt-oss-120b config.json rope_scaling: rope_type yarn, factor 32, beta_fast 32,
beta_slow 1, original_max_position_embeddings 4096, truncate false."""
