"""A stored study resumes across releases that add fields no figure of its own depends on: the
profile and model hashes its fingerprint holds stay those of the release that made it."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.search.optuna_search import content_hash, model_hash, profile_hash

# content_hash under 0211874, before efficiency.attention_head_dims and model.rope_theta existed
BEFORE = {
    "a100-sxm4-80gb": "1313e769e8b75faa1ee92c4f6e4933279bea471ce1d8018b85328bdee070c467",
    "cpu-gloo": "acaa7e1f3b497358514f9bf414c78f65ad4af2cd5b39d6b6a407e15d7d39a1f3",
    "tiny": "320f8bf0d707035f959e8f49072a0d26a276f484cd1ee3c13f2dcad818e9efdc",
    "llama-2-7b": "00259ad9a21a41de82299f7689087a0bd640a1febddf3af0e1029d80d842eb76",
    "llama-3-8b": "0c617b6fb71376a2a935bbce3de2064f0b5a7e1fbdf41e073e5483a28c6cfb75",
    "llama-3.1-8b": "80b7197cc427253ecaa5432873dade0c2437091878ee331a8ef2fe76ca2bdcb8",
}


def _at_full_clock(profile):
    """The profile with the later fields a release added at their defaults: attention_clock,
    and tp_collective_overhead_s, which cpu-gloo now measures (its studies then price DTensor's
    calls and do not resume)."""
    return dataclasses.replace(profile, efficiency=dataclasses.replace(
        profile.efficiency, attention_clock=1.0, tp_collective_overhead_s=0.0))


@pytest.mark.parametrize("name", ["a100-sxm4-80gb", "cpu-gloo"])
def test_a_profile_without_head_dim_figures_hashes_as_before(name) -> None:
    """...and at attention_clock's default (a later field too): the CPU profile leaves it, and
    the A100's figures as they stood hash as before."""
    profile = _at_full_clock(load_profile(name))
    assert profile.efficiency.attention_head_dims is None
    assert profile_hash(profile) == BEFORE[name]
    assert content_hash(profile) != BEFORE[name]  # the new fields are what profile_hash drops


def test_a_profile_read_at_the_loaded_clock_hashes_anew() -> None:
    """The A100 profile reads its attention figures at the loaded node's clock: it prices
    attention otherwise, so a study of its old figures does not resume."""
    a100 = load_profile("a100-sxm4-80gb")
    assert a100.efficiency.attention_clock < 1.0
    assert profile_hash(a100) != BEFORE["a100-sxm4-80gb"]
    assert load_profile("cpu-gloo").efficiency.attention_clock == 1.0


def test_a_profile_that_files_head_dim_figures_hashes_anew() -> None:
    """Its attention is priced differently: a study of its old figures must not resume."""
    h100 = load_profile("h100-sxm-80gb")
    assert h100.efficiency.attention_head_dims
    without = dataclasses.replace(h100, efficiency=dataclasses.replace(
        h100.efficiency, attention_head_dims=None))
    assert profile_hash(h100) != profile_hash(without)


@pytest.mark.parametrize("name", ["tiny", "llama-2-7b", "llama-3-8b", "llama-3.1-8b"])
def test_a_model_hashes_as_before_whatever_its_rope_base(name) -> None:
    """No step time depends on the RoPE base or scaling: Llama 3's base changed from 10000 to
    500000, and Llama 3.1 took its scaling, after studies of them were stored."""
    model = PRESETS[name]
    assert model_hash(model) == BEFORE[name]
    if model.position.value == "rope":
        assert model_hash(model.replace(rope_theta=1e6)) == BEFORE[name]
        assert model_hash(model.replace(rope_scaling=None)) == BEFORE[name]


def test_a_search_fingerprint_leaves_the_rotation_out() -> None:
    """A search study of a llama-3.1 model stored before its preset took rope_scaling (or of
    llama-3 before its base changed) resumes: the request's fingerprint holds the model without
    them, as model_hash does."""
    from autoplan.search.optuna_search import _fingerprint
    from tests.search.conftest import request

    req = request(model="llama-3.1-8b")
    scaled = req.model
    assert scaled.rope_scaling is not None
    before = dataclasses.replace(req, model=scaled.replace(rope_scaling=None, rope_theta=1e4))
    assert _fingerprint(req, "tpe") == _fingerprint(before, "tpe")
    assert "rope_scaling" not in _fingerprint(req, "tpe")
    assert "rope_theta" not in _fingerprint(req, "tpe")


# runtime traits' content_hash under c1a2151, before RuntimeTraits.has_sequence_parallel existed
RUNTIMES_BEFORE = {
    "torchtitan": "1c130d5b0bec", "megatron": "50fd95f2605e", "autoplan-cuda": "a4b548bb6aa2",
    "autoplan-cpu": "cf3681bd585c",
}


@pytest.mark.parametrize("name", ["torchtitan", "autoplan-cuda", "autoplan-cpu"])
def test_runtime_traits_that_keep_a_later_field_at_its_default_hash_as_before(name) -> None:
    """has_sequence_parallel (session 34) changed every runtime's content hash, so no stored
    study resumed; runtime_hash leaves it out at its default (review of 759a233)."""
    from autoplan.cost.runtimes import RuntimeTraits, load_runtime
    from autoplan.search.optuna_search import RUNTIME_OMITTED_AT_DEFAULT, runtime_hash

    traits = load_runtime(name)
    assert all(getattr(traits, f) == RuntimeTraits.__dataclass_fields__[f].default
               for f in RUNTIME_OMITTED_AT_DEFAULT)
    assert runtime_hash(traits) != content_hash(traits)  # the field is what it drops
    assert runtime_hash(traits).startswith(RUNTIMES_BEFORE[name])


def test_a_runtime_that_now_prices_otherwise_hashes_anew() -> None:
    """megatron prices context parallelism as Transformer Engine's P2P ring now (cp_exchange
    te-p2p, a value it changed, not a later field at its default): its studies must not
    resume."""
    from autoplan.cost.runtimes import load_runtime
    from autoplan.search.optuna_search import runtime_hash

    megatron = load_runtime("megatron")
    assert megatron.cp_exchange == "te-p2p"
    assert not runtime_hash(megatron).startswith(RUNTIMES_BEFORE["megatron"])
    assert runtime_hash(dataclasses.replace(megatron, cp_exchange="all-gather")).startswith(
        RUNTIMES_BEFORE["megatron"])


def test_a_runtime_the_later_field_changes_hashes_anew() -> None:
    """megatron-2021 now refuses sequence parallelism: its studies must not resume."""
    from autoplan.cost.runtimes import load_runtime
    from autoplan.search.optuna_search import runtime_hash

    old = load_runtime("megatron-2021")
    assert not old.has_sequence_parallel
    assert runtime_hash(old) != runtime_hash(dataclasses.replace(old, has_sequence_parallel=True))
