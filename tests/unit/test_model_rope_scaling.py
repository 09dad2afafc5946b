"""ModelSpec.rope_scaling (Llama 3.1's RoPE scaling): validation, the presets, Hugging Face
config.json reading, file round trips, the runtime's rotation and checkpoint refusals."""

from __future__ import annotations

import json
import logging
import math

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.model_spec import (
    LLAMA31_ROPE_SCALING,
    PRESETS,
    RopeScaling,
    load_model,
    model_dict,
)
from autoplan.yaml_io import from_dict, to_dict

LLAMA_CFG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
             "vocab_size": 256, "max_position_embeddings": 131072, "rope_theta": 500000.0}
LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""meta-llama/Llama-3.1-8B config.json's rope_scaling."""


@pytest.mark.parametrize(("name", "scaled"), [
    ("llama-3-8b", False), ("llama-3-70b", False), ("llama-2-7b", False),
    ("llama-3.1-8b", True), ("llama-3.1-70b", True), ("llama-3.1-405b", True),
    ("mixtral-8x7b", False), ("tiny-llama", False),
])
def test_llama_31_presets_scale_and_llama_3_does_not(name: str, scaled: bool) -> None:
    assert PRESETS[name].rope_scaling == (LLAMA31_ROPE_SCALING if scaled else None)


@pytest.mark.parametrize(("field", "value"), [
    ("factor", 0.5), ("factor", math.nan), ("factor", True), ("low_freq_factor", 0),
    ("high_freq_factor", 1.0), ("original_max_position_embeddings", 0),
    ("original_max_position_embeddings", 8192.5), ("rope_type", "linear"),
])
def test_bad_scaling_is_one_line_naming_the_field(field: str, value) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(RopeScaling, {**LLAMA31_SCALING, field: value}, "model.rope_scaling")
    assert err.value.field == f"model.rope_scaling.{field}" and "\n" not in str(err.value)


def test_scaling_needs_rotary_positions() -> None:
    with pytest.raises(ConfigError, match="model.rope_scaling: set with position=learned"):
        PRESETS["gpt3-125m"].replace(rope_scaling=LLAMA31_ROPE_SCALING)


def test_files_round_trip_and_omit_no_scaling(tmp_path) -> None:
    """A model without scaling writes no rope_scaling key (files before the field read the
    same); one with it writes and reads it back."""
    assert "rope_scaling" not in model_dict(to_dict(PRESETS["llama-3-8b"]))
    data = model_dict(to_dict(PRESETS["llama-3.1-8b"]))
    assert data["rope_scaling"]["factor"] == 8.0
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_model(str(path)) == PRESETS["llama-3.1-8b"]


def _read(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def test_hf_llama3_scaling_is_read(tmp_path) -> None:
    spec = _read(tmp_path, {**LLAMA_CFG, "rope_scaling": LLAMA31_SCALING})
    assert spec.rope_scaling == LLAMA31_ROPE_SCALING and spec.seq_len == 8192
    # Llama 3.2's factor 32, and the older "type" key
    older = {**{k: v for k, v in LLAMA31_SCALING.items() if k != "rope_type"},
             "type": "llama3", "factor": 32.0}
    assert _read(tmp_path, {**LLAMA_CFG, "rope_scaling": older}).rope_scaling.factor == 32.0
    # transformers 5 keeps it in rope_parameters
    params = {**LLAMA31_SCALING, "rope_theta": 500000.0}
    new = {k: v for k, v in LLAMA_CFG.items() if k != "rope_theta"}
    spec = _read(tmp_path, {**new, "rope_parameters": params})
    assert spec.rope_scaling == LLAMA31_ROPE_SCALING and spec.rope_theta == 5e5
    assert _read(tmp_path, {**LLAMA_CFG, "rope_parameters": {"rope_type": "default"}}
                 ).rope_scaling is None


def test_hf_unmodelled_scaling_warns_and_rotates_without(tmp_path, caplog) -> None:
    dynamic = {"rope_type": "dynamic", "factor": 4.0}  # YaRN is read: test_model_rope_yarn.py
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf_values"):
        spec = _read(tmp_path, {**LLAMA_CFG, "rope_scaling": dynamic})
    assert spec.rope_scaling is None
    assert "rope_type 'dynamic' is not modelled" in caplog.text


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0},  # HF requires all four too
    {**LLAMA31_SCALING, "high_freq_factor": 1.0},
    {**LLAMA31_SCALING, "factor": "8"},
    [8.0],
])
def test_hf_bad_scaling_names_the_file_and_key(tmp_path, scaling) -> None:
    with pytest.raises(ConfigError) as err:
        _read(tmp_path, {**LLAMA_CFG, "rope_scaling": scaling})
    assert "config.json rope_scaling" in str(err.value) and "\n" not in str(err.value)


torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _meta_reference(freq: float, s: RopeScaling) -> float:
    """Meta's llama-models apply_scaling, one frequency at a time, as published."""
    wavelength = 2 * math.pi / freq
    if wavelength < s.original_max_position_embeddings / s.high_freq_factor:
        return freq
    if wavelength > s.original_max_position_embeddings / s.low_freq_factor:
        return freq / s.factor
    smooth = ((s.original_max_position_embeddings / wavelength - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    return (1 - smooth) * freq / s.factor + smooth * freq


@pytest.mark.parametrize("scaling", [LLAMA31_ROPE_SCALING, RopeScaling(factor=32.0),
                                     RopeScaling(original_max_position_embeddings=64,
                                                 high_freq_factor=8.0)])
def test_runtime_frequencies_follow_the_published_rule(scaling: RopeScaling) -> None:
    from autoplan.runtime.models.layers import rope_inv_freq

    plain = rope_inv_freq(128, 500000.0, CPU)
    scaled = rope_inv_freq(128, 500000.0, CPU, scaling)
    want = torch.tensor([_meta_reference(f, scaling) for f in plain.tolist()])
    torch.testing.assert_close(scaled, want, rtol=1e-6, atol=0.0)
    ratio = scaled / plain
    # high frequencies kept, the lowest divided by the factor, some blended between
    assert ratio[0] == 1.0 and math.isclose(ratio[-1].item(), 1 / scaling.factor, rel_tol=1e-6)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_attention_rotates_with_the_scaling(name: str) -> None:
    """The same weights give other outputs once the model scales (64-token sequences, so an
    original window of 64 puts the slow pairs in the scaled band); MLA rotates its rotary
    query/key part with it too."""
    from autoplan.runtime.models.layers import Attention

    spec = PRESETS[name].replace(rope_theta=500000.0)
    scaled = spec.replace(rope_scaling=RopeScaling(original_max_position_embeddings=64))
    if spec.mla is not None:
        from autoplan.runtime.models.mla import MultiHeadLatentAttention as Layer
    else:
        Layer = Attention
    torch.manual_seed(0)
    base = Layer(spec)
    other = Layer(scaled)
    other.load_state_dict(base.state_dict())
    assert other.rope_scaling == scaled.rope_scaling
    x = torch.randn(1, 16, spec.hidden_size)
    with torch.no_grad():
        assert not torch.allclose(base(x), other(x))


def test_context_parallel_tables_use_the_scaling() -> None:
    """cp ranks take their rows of the whole sequence's scaled table."""
    from types import SimpleNamespace

    from autoplan.runtime.context_parallel import ContextParallel
    from autoplan.runtime.models.layers import rope_cos_sin

    scaling = RopeScaling(original_max_position_embeddings=16)
    mesh = SimpleNamespace(size=lambda: 2, get_local_rank=lambda: 1)  # rank 1 of cp 2
    cp = ContextParallel(mesh)
    cos, _ = cp.rope_cos_sin(8, 16, CPU, 500000.0, scaling)
    want, _ = rope_cos_sin(16, 16, CPU, 500000.0, scaling)
    torch.testing.assert_close(cos, want[cp.positions(8, CPU)])
    assert cp.positions(8, CPU).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # the middle chunks
    plain, _ = rope_cos_sin(16, 16, CPU, 500000.0)
    assert not torch.allclose(want, plain)


def test_a_checkpoint_saved_without_the_scaling_is_refused_naming_it(tmp_path) -> None:
    """A llama-3.1 run saved before the preset took its scaling: the weights fit, so the
    refusal names both rotations and how to resume, not 'a different model'."""
    from autoplan.plan import plan_from_dict
    from autoplan.runtime.checkpoint_compat import check_resumable, model_changes, model_fields
    from tests.unit.fake_checkpoint import saved_as

    before = PRESETS["tiny-llama"].replace(rope_theta=500000.0)
    now = before.replace(rope_scaling=LLAMA31_ROPE_SCALING)
    old = {"model": model_fields(before)}
    assert "rope_scaling" not in old["model"]
    assert model_changes(old, before) == []
    assert [c.split(" ")[0] for c in model_changes(old, now)] == ["model.rope_scaling"]
    plan = plan_from_dict({"model": "tiny-llama",
                           "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    found = saved_as(before, tmp_path)
    assert found.meta == old
    with pytest.raises(ConfigError) as err:
        check_resumable(found, plan, now)
    assert str(err.value) == (
        f"--resume: {tmp_path / 'step-00000003'} was trained at RoPE base 500000 without "
        "scaling, this model rotates at RoPE base 500000 with Llama 3.1's scaling (factor 8, "
        "low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192) (the "
        "presets took their published bases and scaling "
        "after it was saved); resume with a model file that sets no rope_scaling, or start a "
        "new run in an empty --checkpoint-dir")
