"""torchtitan export of mixture-of-experts models: flavor matching against the arguments read
from torchtitan's own source (tests/data/export/torchtitan_fields.yaml), the TOML (0.2.2) and
Python (0.3.0) forms of an EP plan parsed back, and one-line refusals naming the field."""

from __future__ import annotations

import ast
import dataclasses
import sys
import types
from typing import Any

import pytest
import tomllib
import yaml

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.export.torchtitan_moe import DEFAULT_BALANCE, moe_flavor
from autoplan.export.torchtitan_text import FUNCTION
from autoplan.model_spec import PRESETS, ModelSpec
from autoplan.moe_spec import MLASpec
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Schedule

from .consumers import DATA, torchtitan_0_3_0_modules

FIELDS = yaml.safe_load((DATA / "torchtitan_fields.yaml").read_text())
MATCHES = {"qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
           "deepseek-v3": ("deepseek_v3", "671B")}
"""autoplan presets torchtitan registers (0.2.2 and 0.3.0 alike)."""


def _plan(model: str | ModelSpec, gpus: int, zero_stage: int = 2, pipeline: Pipeline | None = None,
          **par) -> Plan:
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus), parallel=Parallel(**par),
                batch=Batch(micro_batch_size=1, global_batch_size=8 * gpus),
                zero_stage=zero_stage, sequence_parallel=par.get("tp", 1) > 1,
                **({"pipeline": pipeline} if pipeline else {}))


def _export(p: Plan, fmt: str) -> str:
    [text] = export_plan(get_target("torchtitan"), p, p.model_spec(),
                         ExportOptions(gpus_per_node=8, torchtitan_format=fmt)).values()
    return text


def _preset_args(m: ModelSpec) -> dict[str, Any]:
    """A preset in the argument names of torchtitan's flavor dicts (Qwen3ModelArgs /
    DeepSeekV3ModelArgs with their MoEArgs)."""
    moe = m.moe
    assert moe is not None
    out: dict[str, Any] = {
        "vocab_size": m.vocab_size, "dim": m.hidden_size, "n_layers": m.num_layers,
        "n_heads": m.num_heads, "moe_inter_dim": moe.expert_ffn_hidden_size,
        "num_experts": moe.num_experts, "num_shared_experts": moe.num_shared_experts,
        "top_k": moe.experts_per_token,
        # autoplan's routers: DeepSeek-V3's sigmoid one, or softmax over the top-k logits (the
        # top-k of a softmax renormalised: route_norm true)
        "score_func": "sigmoid" if moe.router_aux_free else "softmax", "route_norm": True,
        "route_scale": moe.routed_scaling_factor}
    if moe.route_groups > 1:
        out |= {"num_expert_groups": moe.route_groups,
                "num_limited_groups": moe.groups_per_token}
    if m.mla is None:
        out |= {"head_dim": m.head_dim, "n_kv_heads": m.kv_heads}
    else:
        out |= {"n_dense_layers": moe.first_dense_layers, "inter_dim": m.ffn,
                "q_lora_rank": m.mla.q_lora_rank or 0, "kv_lora_rank": m.mla.kv_lora_rank,
                "qk_nope_head_dim": m.mla.qk_nope_head_dim,
                "qk_rope_head_dim": m.mla.qk_rope_head_dim, "v_head_dim": m.mla.v_head_dim}
    return out


@pytest.mark.parametrize("name", list(MATCHES))
def test_each_preset_torchtitan_has_matches_its_flavor(name: str):
    found = moe_flavor(PRESETS[name])
    assert found is not None and (found.family, found.flavor) == MATCHES[name]
    # the preset agrees with the flavor as torchtitan's source spells it
    assert _preset_args(PRESETS[name]) == FIELDS["moe_flavor_args_0_2_2"][
        f"{found.family}/{found.flavor}"]
    assert found.flavor in FIELDS["toml_moe_flavors"][found.family]
    assert found.flavor in FIELDS["python_moe_flavors"][found.family]
    assert found.base in FIELDS["python_moe_config_registry"][found.family]


def test_deepseek_16b_routes_unlike_any_autoplan_router():
    """torchtitan's 16B flavor leaves the top-k softmax gates unnormalised (route_norm false),
    which is why MOE_FLAVORS has no entry for it."""
    assert FIELDS["moe_flavor_args_0_2_2"]["deepseek_v3/16B"]["route_norm"] is False


def _replace_moe(m: ModelSpec, **kw) -> ModelSpec:
    assert m.moe is not None
    return m.replace(moe=dataclasses.replace(m.moe, **kw))


QWEN, DSV3 = PRESETS["qwen3-30b-a3b"], PRESETS["deepseek-v3"]
DSV3_TOML = DSV3.replace(mtp_layers=0, seq_len=8192)
"""DeepSeek-V3 as torchtitan 0.2.2's TOML trains it: no MTP, and past original_seq_len 4096,
where its flavor applies the YaRN the model rotates with (at 4096 it would not)."""
PERTURBED = {
    "layers": QWEN.replace(num_layers=47),
    "hidden": QWEN.replace(hidden_size=2560),
    "kv-heads": QWEN.replace(num_kv_heads=8),
    "vocab": QWEN.replace(vocab_size=151552),
    "experts": _replace_moe(QWEN, num_experts=64),
    "top-k": _replace_moe(QWEN, experts_per_token=4),
    "expert-width": _replace_moe(QWEN, expert_ffn_hidden_size=1024),
    "shared": _replace_moe(QWEN, num_shared_experts=1),
    "dense-layers": _replace_moe(DSV3, first_dense_layers=1),
    "interleaved": _replace_moe(QWEN, layer_freq=2),
    "kv-lora": DSV3.replace(mla=MLASpec(256, 64, 128, 128, q_lora_rank=1536)),
    "q-lora": DSV3.replace(mla=MLASpec(512, 64, 128, 128)),
    "dense-ffn": DSV3.replace(ffn_hidden_size=16384),
}


@pytest.mark.parametrize("name", list(PERTURBED))
def test_a_perturbed_shape_matches_no_flavor(name: str):
    m = PERTURBED[name]
    assert moe_flavor(m) is None
    with pytest.raises(ConfigError, match="matches no torchtitan MoE flavor") as err:
        _export(_plan(m, 16, dp=16, ep=8), "python")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "mixtral-8x22b", "gpt-oss-120b", "tiny-moe",
                                  "tiny-deepseek", "tiny-mla"])
def test_models_torchtitan_does_not_register_match_nothing(name: str):
    assert moe_flavor(PRESETS[name]) is None


def _world(par: dict[str, int]) -> int:
    return (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
            * par["tensor_parallel_degree"] * par["context_parallel_degree"]
            * par["pipeline_parallel_degree"])


def test_toml_qwen3_ep_plan_has_torchtitan_0_2_2_fields():
    p = _plan("qwen3-30b-a3b", 32, dp=16, tp=2, ep=8, etp=2)
    doc = tomllib.loads(_export(p, "toml"))
    for section, values in doc.items():
        assert set(values) <= set(FIELDS["toml_0_2_2"][section]), section
    assert doc["model"] == {"name": "qwen3", "flavor": "30B-A3B"}
    par = doc["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (8, 2)
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"]) == (16, 2)
    assert _world(par) == 32
    # torchtitan's efsdp = dp_shard * cp * tp / (etp * ep) must be a whole number of ranks
    assert (par["data_parallel_shard_degree"] * par["context_parallel_degree"]
            * par["tensor_parallel_degree"]) % (8 * 2) == 0


def test_toml_deepseek_v3_without_mtp():
    p = _plan(DSV3_TOML, 64, dp=64, ep=64)
    doc = tomllib.loads(_export(p, "toml"))
    assert doc["model"] == {"name": "deepseek_v3", "flavor": "671B"}
    assert doc["parallelism"]["expert_parallel_degree"] == 64
    assert doc["parallelism"]["expert_tensor_parallel_degree"] == 1


class _Strict:
    """Accepts only the attribute names torchtitan's config class has."""

    def __init__(self, fields: list[str], **values: Any) -> None:
        object.__setattr__(self, "_fields", set(fields))
        object.__setattr__(self, "values", dict(values))

    def __setattr__(self, name: str, value: Any) -> None:
        assert name in self._fields, f"torchtitan has no field {name!r}"
        self.values[name] = value

    def __getattr__(self, name: str) -> Any:
        return self.values[name]


def _fake_torchtitan(monkeypatch, family: str, model: ModelSpec) -> list[_Strict]:
    """torchtitan.models.<family> with only 0.3.0's names; model_registry builds one layer
    config per block, `.moe` a MoE.Config stand-in on the MoE blocks (None on the dense)."""
    new = FIELDS["python_0_3_0"]
    moe_layers: list[_Strict] = []

    def trainer_config() -> _Strict:
        return _Strict(FIELDS["python_trainer_config_fields_0_3_0"],
                       training=_Strict(new["training"]), parallelism=_Strict(new["parallelism"]))

    def model_registry(flavor: str, **kw: Any) -> Any:
        assert flavor in FIELDS["python_moe_flavors"][family]
        assert set(kw) <= set(FIELDS["python_model_registry_kwargs"][family])
        layers = []
        for i in range(model.num_layers):
            moe = model.moe is not None and model.moe.is_moe_layer(i)
            cfg = _Strict(FIELDS["python_moe_config_fields"], load_balance_coeff=DEFAULT_BALANCE)
            moe_layers.extend([cfg] if moe else [])
            layers.append(types.SimpleNamespace(moe=cfg if moe else None))
        return types.SimpleNamespace(flavor=flavor, kwargs=kw,
                                     model=types.SimpleNamespace(layers=layers))

    registry = types.ModuleType(f"torchtitan.models.{family}.config_registry")
    for name in FIELDS["python_moe_config_registry"][family]:
        setattr(registry, name, trainer_config)
    package = types.ModuleType(f"torchtitan.models.{family}")
    package.config_registry, package.model_registry = registry, model_registry
    mtp = types.ModuleType(FIELDS["python_mtp_loss_module"])
    mtp.MTPLoss = types.SimpleNamespace(
        Config=lambda **kw: _Strict(FIELDS["python_mtp_loss_fields"], **kw))
    utils = types.ModuleType(FIELDS["python_config_utils_module"])
    utils.decoder_vocab_size = lambda spec: model.vocab_size
    for name, module in {"torchtitan": types.ModuleType("torchtitan"),
                         "torchtitan.models": types.ModuleType("torchtitan.models"),
                         "torchtitan.models.common": types.ModuleType("torchtitan.models.common"),
                         package.__name__: package, registry.__name__: registry,
                         mtp.__name__: mtp, utils.__name__: utils,
                         **torchtitan_0_3_0_modules()}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return moe_layers


def _run_python(p: Plan, family: str, monkeypatch) -> tuple[_Strict, list[_Strict]]:
    source = _export(p, "python")
    layers = _fake_torchtitan(monkeypatch, family, p.model_spec())
    namespace: dict[str, Any] = {}
    exec(compile(source, "autoplan_torchtitan.py", "exec"), namespace)  # noqa: S102
    return namespace[FUNCTION](), layers


def test_python_qwen3_ep_plan_runs_against_torchtitan_0_3_0_names(monkeypatch):
    p = _plan("qwen3-235b-a22b", 64, zero_stage=3, dp=32, tp=2, ep=16, etp=1)
    config, moe_layers = _run_python(p, "qwen3", monkeypatch)
    assert config.model_spec.flavor == "235B-A22B"
    par = config.parallelism.values
    assert par["expert_parallel_degree"] == 16 and _world(par) == 64
    assert "expert_tensor_parallel_degree" not in par  # not a 0.3.0 field (_Strict checks)
    assert par["fsdp_reshard_after_forward"] == "always"
    # 0.3.0 captures a CUDA graph unless told not to, and refuses it with its all-to-all
    # dispatcher (Trainer.Config._validate_cuda_graphs)
    assert config.training.values["disable_cuda_graphs"] is True
    # autoplan's softmax router has no bias: torchtitan's updates switched off on every layer
    assert len(moe_layers) == 94
    assert {layer.load_balance_coeff for layer in moe_layers} == {None}


@pytest.mark.parametrize("rate", [DEFAULT_BALANCE, 0.01])
def test_python_deepseek_v3_keeps_mtp_and_the_bias_rate(monkeypatch, rate: float):
    m = _replace_moe(DSV3, router_bias_update_rate=rate)
    config, moe_layers = _run_python(_plan(m, 64, dp=64, ep=64), "deepseek_v3", monkeypatch)
    assert (config.model_spec.flavor, config.model_spec.kwargs) == ("671B", {"num_mtp_layers": 1})
    assert config.loss.values == {"global_vocab_size": DSV3.vocab_size}
    assert len(moe_layers) == 58  # 61 blocks, the first 3 dense
    assert {layer.load_balance_coeff for layer in moe_layers} == {rate}
    assert config.parallelism.values["expert_parallel_degree"] == 64


REFUSALS = [
    # (plan, format, the field the one line must name)
    (_plan(_replace_moe(QWEN, capacity_factor=1.25), 16, dp=16, ep=8), "python",
     "model.moe.capacity_factor=1.25"),
    (_plan(_replace_moe(QWEN, router_dtype="bf16"), 16, dp=16, ep=8), "python",
     "model.moe.router_dtype=bf16"),
    (_plan(_replace_moe(QWEN, router_aux_free=True), 16, dp=16, ep=8), "python",
     "model.moe.router_aux_free=true"),
    (_plan(_replace_moe(DSV3, routed_scaling_factor=1.0), 64, dp=64, ep=64), "python",
     "model.moe.routed_scaling_factor=1"),
    (_plan(_replace_moe(DSV3, route_groups=4, route_groups_per_token=2), 64, dp=64, ep=64),
     "python", "model.moe.route_groups=4"),
    (_plan(DSV3, 64, dp=64, ep=64), "toml", "model.mtp_layers=1"),
    (_plan(DSV3, 64, dp=32, pp=2, ep=32), "python", "model.mtp_layers=1 with pp=2"),
    (_plan(_replace_moe(DSV3_TOML, router_bias_update_rate=0.01), 64, dp=64,
           ep=64), "toml", "model.moe.router_bias_update_rate=0.01"),
    (_plan("qwen3-30b-a3b", 32, dp=16, pp=2, ep=8,
           pipeline=Pipeline(Schedule.ONE_F_ONE_B)), "toml", "pp=2"),
    (_plan(DSV3_TOML, 64, dp=32, cp=2, ep=32), "toml", "cp=2"),
    (_plan("qwen3-30b-a3b", 32, dp=16, tp=2, ep=8, etp=2), "python", "parallel.etp=2 with ep=8"),
    (_plan("qwen3-30b-a3b", 16, dp=8, tp=2, ep=1, etp=1), "python", "parallel.etp=1 with ep=1"),
    (_plan("qwen3-30b-a3b", 16, dp=16, dp_shard=2, ep=8), "python", "parallel.ep=8 etp=1"),
    (_plan("qwen3-30b-a3b", 16, zero_stage=0, dp=16, ep=8), "python",
     "parallel.ep=8 with zero_stage=0"),
]


@pytest.mark.parametrize(("p", "fmt", "field"), REFUSALS, ids=[r[2] for r in REFUSALS])
def test_each_refusal_is_one_line_naming_the_field(p: Plan, fmt: str, field: str):
    with pytest.raises(ConfigError) as err:
        _export(p, fmt)
    text = str(err.value)
    assert field in text and "\n" not in text and err.value.exit_code == 2


def test_toml_accepts_etp_equal_to_tp_that_python_refuses():
    p = REFUSALS[10][0]
    assert tomllib.loads(_export(p, "toml"))["parallelism"]["expert_tensor_parallel_degree"] == 2


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_real_torchtitan_parses_the_moe_export(fmt: str, tmp_path, monkeypatch):
    """Runs where torchtitan is installed (not a dev dependency): its ConfigManager loads the
    Qwen3-30B-A3B EP plan in the form its version reads."""
    manager = pytest.importorskip("torchtitan.config.manager")
    python_form = hasattr(pytest.importorskip("torchtitan.config"), "ParallelismConfig")
    if python_form != (fmt == "python"):
        pytest.skip(f"the installed torchtitan does not read the {fmt} form")
    text = _export(_plan("qwen3-30b-a3b", 16, dp=16, ep=8), fmt)
    if python_form:
        (tmp_path / "autoplan_tt_qwen3.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        argv = ["--module", "autoplan_tt_qwen3", "--config", FUNCTION]
    else:
        (tmp_path / "job.toml").write_text(text)
        argv = ["--job.config_file", str(tmp_path / "job.toml")]
    config = manager.ConfigManager().parse_args(argv)
    assert config.parallelism.expert_parallel_degree == 8


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_deepseek_v3_pipeline_names_every_block_once(fmt: str):
    p = _plan(DSV3_TOML, 128, dp=32, pp=4, ep=32,
              pipeline=Pipeline(Schedule.ONE_F_ONE_B, 1, (16, 15, 15, 15)))
    text = _export(p, fmt)
    if fmt == "toml":
        par = tomllib.loads(text)["parallelism"]
    else:
        tree = ast.parse(text)
        par = {node.targets[0].attr: ast.literal_eval(node.value) for node in ast.walk(tree)
               if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
               and ast.unparse(node.targets[0].value) == "config.parallelism"}
    parts = par["module_fqns_per_model_part"]
    assert [len(part) for part in parts] == [17, 15, 15, 17]  # + embeddings; + norm, head
    assert [m for part in parts for m in part if m.startswith("layers.")] == [
        f"layers.{i}" for i in range(61)]
    assert parts[-1][-1] == ("output" if fmt == "toml" else "lm_head")
    assert (par["pipeline_parallel_degree"], par["expert_parallel_degree"]) == (4, 32)


def test_python_fp8_converts_linears_and_experts_as_torchtitans_own_recipe(monkeypatch):
    """0.3.0's deepseek_v3_671b_float8: Float8LinearConverter with lm_head and router.gate left
    16-bit, and Float8GroupedExpertsConverter on the experts; compile stays off."""
    from autoplan.plan import Precision

    p = _plan(DSV3, 64, dp=64, ep=64).replace(precision=Precision.FP8)
    config, _ = _run_python(p, "deepseek_v3", monkeypatch)
    linear, experts = config.model_spec.kwargs["converters"]
    assert linear.kw == {"filter_fqns": ["lm_head", "router.gate"]} and experts.kw == {}
    assert type(config.compile).__name__ == "CompileConfig" and config.compile.kw == {}


def test_toml_fp8_experts_are_refused():
    from autoplan.plan import Precision

    p = _plan("qwen3-30b-a3b", 32, dp=16, tp=2, ep=8, etp=2).replace(precision=Precision.FP8)
    with pytest.raises(ConfigError) as err:
        _export(p, "toml")
    assert "precision fp8 with experts" in str(err.value) and "\n" not in str(err.value)
