"""autoplan.rope_scaling: an explicit null refused, "same rotation" by effect (RopeScaling.effect,
same_rotation) and the one description every message uses (RopeScaling.describe)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.errors import ConfigError
from autoplan.rope_scaling import (
    DEEPSEEK_V3_ROPE_SCALING,
    LLAMA31_ROPE_SCALING,
    RopeScaling,
    same_rotation,
    scaling_words,
)
from autoplan.yaml_io import from_dict

YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}


@pytest.mark.parametrize(("data", "field", "expected"), [
    ({"factor": None}, "factor", "expected a number"),
    ({"high_freq_factor": None}, "high_freq_factor", "expected a number"),
    ({"original_max_position_embeddings": None}, "original_max_position_embeddings",
     "expected an integer"),
    ({**YARN, "beta_fast": None}, "beta_fast", "expected a number"),
    ({**YARN, "truncate": None}, "truncate", "expected true or false"),
    ({**YARN, "factor": None}, "factor", "expected a number"),
])
def test_an_explicit_null_is_refused_not_defaulted(data: dict, field: str, expected: str) -> None:
    """`factor: null` was refused before YaRN ("got None (null); expected a number"); it must
    not take Llama 3.1's default silently. YaRN's optional fields (mscale...) may be null."""
    with pytest.raises(ConfigError) as err:
        from_dict(RopeScaling, data, "model.rope_scaling")
    assert (err.value.field, err.value.problem, err.value.fix) == (
        f"model.rope_scaling.{field}", "got None (null)", expected)
    loaded = from_dict(RopeScaling, {**YARN, "mscale": None, "low_freq_factor": None},
                       "model.rope_scaling")
    assert loaded == RopeScaling(**YARN) and loaded.low_freq_factor is None


def test_same_rotation_compares_by_effect_not_by_spelling() -> None:
    """DeepSeek-V3's mscale = mscale_all_dim = 1 and an attention_factor of 1 with
    mscale_all_dim 1 scale alike; an mscale alone is ignored (as HF ignores it); factor 1 does
    nothing, as no scaling; another window, beta, truncation or magnitude differs."""
    ds = DEEPSEEK_V3_ROPE_SCALING
    assert same_rotation(ds, RopeScaling(**YARN, attention_factor=1.0, mscale_all_dim=1.0))
    assert same_rotation(RopeScaling(**YARN), RopeScaling(**YARN, mscale=0.5))
    assert ds != RopeScaling(**YARN, attention_factor=1.0, mscale_all_dim=1.0)  # spelt apart
    assert same_rotation(None, RopeScaling(factor=1.0))
    assert same_rotation(None, RopeScaling(rope_type="yarn", factor=1.0,
                                           original_max_position_embeddings=4096))
    assert not same_rotation(None, RopeScaling(rope_type="yarn", factor=1.0, attention_factor=2.0,
                                               original_max_position_embeddings=4096))
    for change in ({"original_max_position_embeddings": 8192}, {"beta_slow": 2.0},
                   {"truncate": False}, {"mscale_all_dim": 0.707}, {"factor": 32.0}):
        assert not same_rotation(ds, dataclasses.replace(ds, **change)), change
    assert not same_rotation(LLAMA31_ROPE_SCALING, RopeScaling(high_freq_factor=8.0))
    assert not same_rotation(LLAMA31_ROPE_SCALING, None)


def test_describe_names_the_fields_and_yarns_magnitudes() -> None:
    assert DEEPSEEK_V3_ROPE_SCALING.describe() == (
        "YaRN scaling (factor 40, original_max_position_embeddings 4096, beta_fast 32, "
        "beta_slow 1, truncate true; cos/sin x1, softmax x1.874)")
    assert LLAMA31_ROPE_SCALING.describe() == (
        "Llama 3.1's scaling (factor 8, low_freq_factor 1, high_freq_factor 4, "
        "original_max_position_embeddings 8192)")
    assert scaling_words(None) == "no scaling"
