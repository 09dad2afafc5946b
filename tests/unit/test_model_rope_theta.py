"""ModelSpec.rope_theta: validation, the presets' published bases, Hugging Face config.json
reading, and the YAML round trips that must keep it (and read files written before it)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, PositionKind, load_model, model_dict
from autoplan.plan import ClusterRef, Plan
from autoplan.plan_files import load_plan, plan_to_dict, save_plan
from autoplan.yaml_io import to_dict

LLAMA3 = PRESETS["llama-3-8b"]


def test_default_keeps_every_spec_meaning() -> None:
    assert PRESETS["gpt3-1.3b"].rope_theta == 10000.0
    assert LLAMA3.replace(rope_theta=500000).rope_theta == 500000.0  # an int reads as a float
    assert isinstance(LLAMA3.replace(rope_theta=500000).rope_theta, float)


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, 2e9, True, "500000", None])
def test_bad_theta_is_one_line_naming_the_field(value) -> None:
    with pytest.raises(ConfigError) as err:
        LLAMA3.replace(rope_theta=value)
    assert err.value.field == "model.rope_theta" and "\n" not in str(err.value)


def test_learned_positions_refuse_a_base() -> None:
    """As router_bias_update_rate without router_aux_free: a base other than the default on a
    model without RoPE is refused; the default is accepted (nothing set)."""
    gpt = PRESETS["gpt3-1.3b"]
    assert gpt.replace(rope_theta=10000.0) == gpt
    with pytest.raises(ConfigError, match="model.rope_theta: 500000 with position=learned"):
        gpt.replace(rope_theta=500000.0)


@pytest.mark.parametrize(("name", "theta"), [
    ("llama-2-7b", 1e4), ("llama-2-13b", 1e4), ("llama-2-70b", 1e4),
    ("llama-3-8b", 5e5), ("llama-3-70b", 5e5), ("llama-3.1-8b", 5e5), ("llama-3.1-70b", 5e5),
    ("llama-3.1-405b", 5e5), ("mistral-7b", 1e4), ("mixtral-8x7b", 1e6),
    ("mixtral-8x22b", 1e6), ("qwen3-30b-a3b", 1e6), ("qwen3-235b-a22b", 1e6),
    ("deepseek-v3", 1e4), ("gpt-oss-120b", 1.5e5),
    ("tiny", 1e4), ("tiny-llama", 1e4), ("tiny-moe", 1e4), ("tiny-deepseek", 1e4),
    ("tiny-mla", 1e4),
])
def test_presets_carry_their_published_base(name: str, theta: float) -> None:
    """config.json `rope_theta` of each model (cited in model_spec.py / moe_spec.py); the tiny
    presets of the runtime's parity tests keep the default."""
    assert PRESETS[name].rope_theta == theta


def _read(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


LLAMA_CFG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
             "vocab_size": 256, "max_position_embeddings": 8192}


def test_hf_config_rope_theta(tmp_path) -> None:
    assert _read(tmp_path, {**LLAMA_CFG, "rope_theta": 500000.0}).rope_theta == 500000.0
    assert _read(tmp_path, {**LLAMA_CFG, "rope_theta": 500000}).rope_theta == 500000.0
    assert _read(tmp_path, LLAMA_CFG).rope_theta == 10000.0  # LlamaConfig's default
    # transformers 5 writes it inside rope_parameters
    new = {**LLAMA_CFG, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert _read(tmp_path, new).rope_theta == 1e6
    # rope_scaling does not change the base (tests/unit/test_model_rope_scaling.py reads it)
    scaled = {**LLAMA_CFG, "rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}
    assert _read(tmp_path, scaled).rope_theta == 500000.0


def test_hf_family_defaults_and_neox(tmp_path) -> None:
    mixtral = {**LLAMA_CFG, "model_type": "mixtral", "num_local_experts": 4,
               "num_experts_per_tok": 2}
    assert _read(tmp_path, mixtral).rope_theta == 1e6  # MixtralConfig's default
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 256,
            "max_position_embeddings": 2048, "rotary_emb_base": 20000}
    assert _read(tmp_path, neox).rope_theta == 20000.0


@pytest.mark.parametrize("value", [0, -5, "1e6", True, [1]])
def test_bad_hf_rope_theta_names_the_key(tmp_path, value) -> None:
    with pytest.raises(ConfigError, match="rope_theta") as err:
        _read(tmp_path, {**LLAMA_CFG, "rope_theta": value})
    assert "\n" not in str(err.value)


def _plan(model) -> Plan:
    from autoplan.plan import Batch, Parallel

    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", 8), parallel=Parallel(dp=8),
                batch=Batch(micro_batch_size=1, global_batch_size=64))


def test_inline_model_keeps_its_base(tmp_path) -> None:
    p = _plan(LLAMA3)
    assert plan_to_dict(p)["model"]["rope_theta"] == 500000.0
    written = save_plan(p, tmp_path / "plan.yaml")  # which reloads and compares
    assert load_plan(written).model_spec().rope_theta == 500000.0


def test_files_without_the_field_read_as_before(tmp_path) -> None:
    """A default base is left out of what is written, so plans and checkpoints of models at
    10000 read back byte-identical; an older file, without the field, loads at 10000."""
    tiny = PRESETS["tiny-llama"]
    data = plan_to_dict(_plan(tiny))
    assert "rope_theta" not in data["model"]
    assert "rope_theta" not in model_dict(to_dict(tiny))
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_plan(path).model_spec() == tiny
    model_file = tmp_path / "model.yaml"
    model_file.write_text(yaml.safe_dump({**model_dict(to_dict(tiny)), "rope_theta": 2e5}))
    assert load_model(str(model_file)).rope_theta == 2e5


def test_checkpoints_compare_the_base() -> None:
    """A checkpoint saved before the field (no rope_theta) resumes a model at 10000 and says
    the base changed for one at 500000."""
    pytest.importorskip("torch")
    from autoplan.runtime.checkpoint_compat import model_changes, model_fields

    tiny = PRESETS["tiny-llama"]
    old = {"model": model_fields(tiny)}
    assert "rope_theta" not in old["model"] and model_changes(old, tiny) == []
    assert model_changes(old, tiny.replace(rope_theta=5e5)) == [
        "model.rope_theta 10000.0 -> 500000.0"]


def test_a_checkpoint_at_another_base_is_refused_with_the_base_to_resume_at(tmp_path) -> None:
    """A run of the llama-3 presets saved before they took 500000 trained at 10000: its weights
    fit, so the refusal names the base and how to resume at it, not 'a different shape'."""
    pytest.importorskip("torch")
    from autoplan.plan import plan_from_dict
    from autoplan.runtime.checkpoint_compat import check_resumable
    from tests.unit.fake_checkpoint import saved_as

    tiny = PRESETS["tiny-llama"]
    plan = plan_from_dict({"model": "tiny-llama",
                           "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    found = saved_as(tiny, tmp_path, step=5)
    assert check_resumable(found, plan, tiny) is None
    with pytest.raises(ConfigError) as err:
        check_resumable(found, plan, tiny.replace(rope_theta=5e5))
    assert str(err.value) == (
        f"--resume: {tmp_path / 'step-00000005'} was trained at RoPE base 10000 without "
        "scaling, this model rotates at RoPE base 500000 without scaling (the presets took "
        "their published bases and scaling after it was saved); resume with a model file that "
        "sets rope_theta: 10000, or start a new run in an empty --checkpoint-dir")
    assert tiny.position == PositionKind.ROPE
