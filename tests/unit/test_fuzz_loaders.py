"""Fuzz the strict loaders: mutated YAML documents raise ConfigError, never anything else."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.errors import ConfigError
from autoplan.hardware import PROFILES_DIR, profile_from_dict
from autoplan.model_spec import load_model
from autoplan.plan import plan_from_dict

PLAN = {
    "schema_version": 1, "model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 4},
    "parallel": {"dp": 2, "tp": 2, "pp": 1, "cp": 1}, "sequence_parallel": True,
    "pipeline": {"schedule": "1f1b", "vpp": 1, "layers_per_stage": [2, 2]}, "zero_stage": 1,
    "offload": {"optimizer": False, "params": False},
    "recompute": {"policy": "full", "num_layers": 2},
    "batch": {"micro_batch_size": 2, "global_batch_size": 8}, "precision": "fp32",
}
MODEL = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
         "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 64, "mlp": "swiglu",
         "norm": "rmsnorm", "position": "rope", "bias": False, "tie_embeddings": True}
PROFILE = yaml.safe_load((PROFILES_DIR / "a100-sxm4-80gb.yaml").read_text())

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True),
    st.text(max_size=8), st.lists(st.integers(-2, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))


@st.composite
def mutated(draw, base):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(scalars)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(scalars)
    if draw(st.booleans()):  # also through the YAML text itself
        doc = yaml.safe_load(yaml.safe_dump(doc))
    return doc


def _only_config_errors(loader, doc) -> None:
    try:
        loader(doc)
    except ConfigError as err:
        assert "\n" not in str(err)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(PLAN))
def test_plan_loader_raises_only_config_errors(doc) -> None:
    _only_config_errors(plan_from_dict, doc)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(MODEL))
def test_model_loader_raises_only_config_errors(doc) -> None:
    _only_config_errors(load_model, doc)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(PROFILE))
def test_profile_loader_raises_only_config_errors(doc) -> None:
    _only_config_errors(profile_from_dict, doc)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_top_level_values(text) -> None:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    _only_config_errors(plan_from_dict, doc)
