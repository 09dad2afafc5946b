"""torchtitan export: the TOML form against torchtitan 0.2.2's job-config fields, the Python form
executed against stand-ins that accept only torchtitan 0.3.0's field names, and pipeline schedule
names resolved by torch.distributed.pipelining itself (which torchtitan calls)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import tomllib
import yaml

from autoplan.cost.params import total_params
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.export.torchtitan import flavor
from autoplan.export.torchtitan_text import FUNCTION
from autoplan.plan import (
    Attention,
    Batch,
    Offload,
    Parallel,
    Pipeline,
    Precision,
    Recompute,
    RecomputePolicy,
    Schedule,
)

from .cases import CASES, plan
from .consumers import DATA, torchtitan_0_3_0_modules

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "torchtitan" in ok]
FIELDS = yaml.safe_load((DATA / "torchtitan_fields.yaml").read_text())


def _export(case_or_plan: Any, fmt: str) -> str:
    p = CASES[case_or_plan][0] if isinstance(case_or_plan, str) else case_or_plan
    files = export_plan(
        get_target("torchtitan"),
        p,
        p.model_spec(),
        ExportOptions(gpus_per_node=8, torchtitan_format=fmt),
    )
    [text] = files.values()
    return text


def _check_parallelism(p, par: dict[str, Any], training: dict[str, Any]) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    degrees = (
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "context_parallel_degree",
    )
    world = 1
    for key in degrees:
        world *= par[key]
    assert world == p.world_size
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    if p.zero_stage >= 1:  # FSDP2 over the shard degree, HSDP replicas across the rest
        assert par["data_parallel_shard_degree"] == (p.parallel.dp_shard or p.parallel.dp)
    if p.grad_reduce_dtype is not None:
        assert training["mixed_precision_reduce"] == "float32"
    if p.parallel.pp > 1:
        get_schedule_class(par["pipeline_parallel_schedule"])  # torch knows the name
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == p.parallel.pp * p.pipeline.vpp
        layers = [m for part in parts for m in part if m.startswith("layers.")]
        assert layers == [f"layers.{i}" for i in range(p.model_spec().num_layers)]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2] == "norm"
        assert training["local_batch_size"] * dp == p.batch.global_batch_size
    else:
        assert training["local_batch_size"] == p.batch.micro_batch_size
    assert training["global_batch_size"] == p.batch.global_batch_size


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_toml_uses_only_torchtitan_0_2_2_fields(case: str):
    p = CASES[case][0]
    try:
        doc = tomllib.loads(_export(case, "toml"))
    except ConfigError as err:  # some plans only the newer Python form can express
        assert "python" in str(err)
        return
    known = FIELDS["toml_0_2_2"]
    for section, values in doc.items():
        assert set(values) <= set(known[section]), section
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    assert doc["model"]["flavor"] in FIELDS["toml_llama3_flavors"]
    assert doc["activation_checkpoint"]["mode"] in FIELDS["toml_activation_checkpoint_modes"]
    assert p.parallel.pp == 1 or (
        doc["parallelism"]["module_fqns_per_model_part"][-1][-1] == "output"
    )
    _check_parallelism(p, doc["parallelism"], doc["training"])


class _Section:
    """Accepts only the attribute names torchtitan's dataclass has."""

    def __init__(self, fields: list[str]) -> None:
        object.__setattr__(self, "_fields", set(fields))
        object.__setattr__(self, "values", {})

    def __setattr__(self, name: str, value: Any) -> None:
        assert name in self._fields, f"torchtitan has no field {name!r}"
        self.values[name] = value

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "values")
        if name not in values:
            raise AttributeError(name)
        return values[name]


def _config_class(name: str, fields: list[str]) -> type:
    """A stand-in for torchtitan's `name` with a Config taking only the fields torchtitan's has."""

    class Config:
        def __init__(self, **kw: Any) -> None:
            assert set(kw) <= set(fields), f"torchtitan's {name}.Config has no {set(kw) - set(fields)}"
            self.__dict__.update(kw)

        def __setattr__(self, key: str, value: Any) -> None:  # slots: only its own fields
            assert key in fields, f"torchtitan's {name}.Config has no {key}"
            self.__dict__[key] = value

    return type(name, (), {"Config": Config})


class _Layers(list):
    """What the fake _build_llama3_layers returns: n_layers block configs (TransformerBlock's
    fields only, norms at RMSNorm.Config's eps 1e-5), and its arguments by name."""

    def __init__(self, kw: dict[str, Any], custom: dict[str, Any]) -> None:
        block, norm = (_config_class(n, custom[n]) for n in ("TransformerBlock", "RMSNorm"))
        super().__init__(block.Config(attention_norm=norm.Config(eps=1e-5),
                                      ffn_norm=norm.Config(eps=1e-5))
                         for _ in range(kw["n_layers"]))
        self.kw = kw

    def __getitem__(self, key: Any) -> Any:
        return self.kw[key] if isinstance(key, str) else super().__getitem__(key)


def _fake_torchtitan(monkeypatch) -> None:
    new = FIELDS["python_0_3_0"]
    custom = FIELDS["python_custom_llama3"]

    def trainer_config() -> Any:
        assert "compile" in FIELDS["python_trainer_config_fields_0_3_0"]
        config = _Section(FIELDS["python_trainer_config_fields"] + custom["trainer_config_fields"]
                          + ["compile"])
        object.__setattr__(config, "training", _Section(new["training"]))
        object.__setattr__(config, "parallelism", _Section(new["parallelism"]))
        return config

    registry = types.ModuleType("torchtitan.models.llama3.config_registry")
    for name in FIELDS["python_llama3_config_registry"]:
        setattr(registry, name, trainer_config)
    llama3 = types.ModuleType("torchtitan.models.llama3")
    llama3.config_registry = registry
    llama3.llama3_configs = {}
    llama3.Llama3Model = _config_class("Llama3Model", custom["Llama3Model"])
    for name in custom["private_names"]:
        if name.isupper() or name.lstrip("_").isupper():
            setattr(llama3, name, name)

    def build_layers(**kw: Any) -> _Layers:
        assert set(kw) <= set(custom["build_llama3_layers"]), kw
        return _Layers(kw, custom)

    helpers = {"_build_llama3_layers": build_layers,
               "_output_linear_init": lambda dim: f"output_init:{dim}"}
    for name in custom["private_names"]:  # only what torchtitan 0.3.0 has
        if name in helpers:
            setattr(llama3, name, helpers[name])

    def model_registry(flavor: str, converters: list | None = None) -> Any:
        llama3.converters = converters  # what torchtitan would apply to the model config
        if flavor in llama3.llama3_configs:  # defined by the exported module
            return ("spec", flavor, llama3.llama3_configs[flavor](attn_backend="flex"))
        assert flavor in FIELDS["python_llama3_flavors"]
        return f"spec:{flavor}"

    llama3.model_registry = model_registry
    common = types.ModuleType("torchtitan.models.common")
    for name in ("Embedding", "RMSNorm", "Linear", "ComplexRoPE"):
        setattr(common, name, _config_class(name, custom[name]))
    config_utils = types.ModuleType("torchtitan.models.common.config_utils")
    config_utils.decoder_vocab_size = lambda spec: spec[2].vocab_size
    loss = types.ModuleType("torchtitan.components.loss")
    for name in ("ChunkedLossWrapper", "CrossEntropyLoss"):
        setattr(loss, name, _config_class(name, custom[name]))
    ac = types.ModuleType(FIELDS["python_activation_checkpoint_module"])
    for name in FIELDS["python_activation_checkpoint_classes"]:
        setattr(ac, name, type(name, (), {"Config": type("Config", (), {})}))
    models = types.ModuleType("torchtitan.models")
    models.llama3 = llama3
    for name, module in {
        "torchtitan": types.ModuleType("torchtitan"),
        "torchtitan.components": types.ModuleType("torchtitan.components"),
        "torchtitan.components.loss": loss,
        "torchtitan.distributed": types.ModuleType("torchtitan.distributed"),
        "torchtitan.models": models,
        "torchtitan.models.common": common,
        "torchtitan.models.common.config_utils": config_utils,
        "torchtitan.models.llama3": llama3,
        "torchtitan.models.llama3.config_registry": registry,
        ac.__name__: ac,
        **torchtitan_0_3_0_modules(),
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def _check_custom_model(spec: Any, values: dict[str, Any], model) -> None:
    """The model the Python config defines for a shape torchtitan does not register."""
    kind, flavor_name, built = spec
    assert (kind, flavor_name) == ("spec", f"autoplan-{model.name}")
    layers = built.layers
    assert (built.dim, built.vocab_size, built.enable_weight_tying) == (
        model.hidden_size, model.vocab_size, model.tie_embeddings)
    assert (layers["n_layers"], layers["n_heads"], layers["n_kv_heads"], layers["hidden_dim"]) == (
        model.num_layers, model.num_heads, model.kv_heads, model.ffn)
    assert layers["rope"].dim == model.head_dim and layers["rope"].max_seq_len >= model.seq_len
    assert built.tok_embeddings.num_embeddings == built.lm_head.out_features == model.vocab_size
    assert values["loss"].loss_fn.global_vocab_size == model.vocab_size


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_python_config_runs_against_torchtitan_0_3_0_names(case: str, monkeypatch):
    p = CASES[case][0]
    source = _export(case, "python")
    _fake_torchtitan(monkeypatch)
    namespace: dict[str, Any] = {}
    exec(compile(source, "autoplan_torchtitan.py", "exec"), namespace)  # noqa: S102
    config = namespace[FUNCTION]()
    model = p.model_spec()
    if flavor(model) is None:
        _check_custom_model(config.values["model_spec"], config.values, model)
    else:
        assert config.values["model_spec"] == f"spec:{flavor(model)[0]}"
    par, training = config.parallelism.values, config.training.values
    _check_parallelism(p, par, training)
    assert par["enable_sequence_parallel"] == p.sequence_parallel
    # CUDA graphs, torchtitan 0.3.0's default, are refused with a pipeline
    assert training.get("disable_cuda_graphs", False) == (p.parallel.pp > 1)
    ac = config.values["activation_checkpoint"]
    assert (ac is None) == (p.recompute.policy != RecomputePolicy.FULL)


@pytest.mark.parametrize(
    ("changes", "fmt", "why"),
    [
        ({"zero_stage": 1}, "python", "no ZeRO stage 1"),
        ({"precision": Precision.FP16}, "python", "bf16 or fp32"),
        ({"attention": Attention.EAGER}, "python", "SDPA"),
        ({"offload": Offload(optimizer=True), "zero_stage": 3}, "python", "together"),
        ({"recompute": Recompute(RecomputePolicy.FULL, 2)}, "python", "every block or none"),
        (
            {"parallel": Parallel(dp=4, pp=4), "pipeline": Pipeline(Schedule.ONE_F_ONE_B, vpp=2)},
            "python",
            "Interleaved1F1B",
        ),
        ({"parallel": Parallel(dp=8, tp=2)}, "toml", "shards the norms over tp"),
        ({"zero_stage": 0}, "toml", "only through FSDP"),
    ],
)
def test_refusals_name_the_reason(changes: dict, fmt: str, why: str):
    changes.setdefault("zero_stage", 2)
    p = plan("llama-3.1-8b", 16, batch=Batch(1, 64), **changes)
    with pytest.raises(ConfigError, match=why):
        _export(p, fmt)


def test_tied_embeddings_are_refused_under_a_pipeline():
    """torchtitan 0.3.0's Decoder.Config.update_from_config raises for weight tying with
    pp > 1; Llama 3.2's tied 1B flavor exports without a pipeline."""
    import dataclasses

    from autoplan.export.torchtitan import flavor

    tied = dataclasses.replace(plan("llama-3.1-8b").model_spec(), name="llama-3.2-1b",
                               num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8,
                               ffn_hidden_size=8192, tie_embeddings=True, head_dim=64)
    assert flavor(tied) == ("1B", "llama3_1b")
    base = {"zero_stage": 2, "batch": Batch(1, 64)}
    flat = plan(tied, 16, **base)
    assert "model_registry('1B')" in _export(flat, "python")
    piped = plan(tied, 16, parallel=Parallel(dp=8, pp=2), **base)
    with pytest.raises(ConfigError, match="tie_embeddings with pp > 1"):
        _export(piped, "python")


def test_gpt_models_are_not_torchtitan_llama3_models():
    with pytest.raises(ConfigError, match="gelu.*layernorm.*learned.*biases"):
        _export(plan(zero_stage=2), "python")


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_real_torchtitan_parses_the_export(case: str, tmp_path, monkeypatch):
    """Runs where torchtitan is installed (it needs triton; not a dev dependency): its own
    ConfigManager loads the Python config (>= 0.3) or the TOML (<= 0.2.2) and validates it."""
    manager = pytest.importorskip("torchtitan.config.manager")
    python_form = hasattr(pytest.importorskip("torchtitan.config"), "ParallelismConfig")
    try:
        text = _export(case, "python" if python_form else "toml")
    except ConfigError:
        pytest.skip("this torchtitan version's format cannot express the plan")
    if python_form:
        module = f"autoplan_tt_{case.replace('-', '_')}"
        (tmp_path / f"{module}.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        argv = ["--module", module, "--config", FUNCTION]
    else:
        (tmp_path / "job.toml").write_text(text)
        argv = ["--job.config_file", str(tmp_path / "job.toml")]
    config = manager.ConfigManager().parse_args(argv)
    assert config.parallelism.tensor_parallel_degree == CASES[case][0].parallel.tp
    model = CASES[case][0].model_spec()
    if python_form and flavor(model) is None:  # the model the config defines, built on meta
        import torch

        with torch.device("meta"):
            built = config.model_spec.model.build()
        assert sum(t.numel() for t in built.parameters()) == total_params(model)


def test_any_printable_model_name_gives_a_module_python_parses():
    import dataclasses

    odd = dataclasses.replace(plan("llama-2-13b").model_spec(), name='my "13b" \\ """model')
    source = _export(plan(odd, 64, zero_stage=3, batch=Batch(2, 512)), "python")
    compile(source, "autoplan_torchtitan.py", "exec")  # raises SyntaxError if it does not
    assert 'my \\"13b\\" \\\\ \\"\\"\\"model' in source.splitlines()[0]


def _run_python(p, monkeypatch) -> Any:
    """The exported config_registry function, run against the 0.3.0 stand-ins."""
    source = _export(p, "python")
    _fake_torchtitan(monkeypatch)
    namespace: dict[str, Any] = {}
    exec(compile(source, "autoplan_torchtitan.py", "exec"), namespace)  # noqa: S102
    return namespace[FUNCTION]()


ZB_SPLIT = (2, 4, 4, 4, 4, 4, 4, 6)


def _zero_bubble(pp: int, vpp: int) -> Any:
    split = ZB_SPLIT if (pp, vpp) == (4, 2) else None
    return plan("llama-3.1-8b", 8 * pp, parallel=Parallel(dp=2, tp=4, pp=pp), zero_stage=2,
                sequence_parallel=True, batch=Batch(1, 32),
                pipeline=Pipeline(Schedule.ZERO_BUBBLE, vpp=vpp, layers_per_stage=split))


@pytest.mark.parametrize("fmt", ["toml", "python"])
def test_zero_bubble_with_two_stages_per_rank_runs_as_zbv(fmt: str, monkeypatch):
    """autoplan prices zero-bubble with vpp 2 in the V placement, stages r and 2pp-1-r on rank r
    (plan_table.stages_of_rank, cost/rows.py v_shape); torchtitan places stages so only for
    ScheduleZBVZeroBubble (stage_ids_this_rank, style "v"), every other schedule in a loop."""
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble, get_schedule_class

    from autoplan.plan_table import stages_of_rank

    p = _zero_bubble(4, 2)
    if fmt == "toml":
        par = tomllib.loads(_export(p, "toml"))["parallelism"]
    else:
        par = _run_python(p, monkeypatch).parallelism.values
    assert get_schedule_class(par["pipeline_parallel_schedule"]) is ScheduleZBVZeroBubble
    assert [tuple(stages_of_rank(p, r)) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    deeper = tomllib.loads(_export(_zero_bubble(2, 4), "toml"))["parallelism"]
    assert deeper["pipeline_parallel_schedule"] == "InterleavedZeroBubble"


@pytest.mark.parametrize(("recompute", "early_stop"), [
    (Recompute(RecomputePolicy.FULL), True),
    (Recompute(RecomputePolicy.FULL, 8), True),  # every 4th block: selective_ac_option "4"
    (Recompute(RecomputePolicy.SELECTIVE), None),
    (Recompute(RecomputePolicy.NONE), None),
])
def test_toml_full_checkpointing_stops_early(recompute: Recompute, early_stop: bool | None):
    """The torchtitan runtime prices full recompute with torch's early stop
    (recompute_early_stop); 0.2.2 passes [activation_checkpoint] early_stop, default false, to
    its checkpoint wrapper."""
    p = plan("llama-3.1-8b", 8, parallel=Parallel(dp=8), zero_stage=3, recompute=recompute,
             batch=Batch(2, 64))
    ac = tomllib.loads(_export(p, "toml"))["activation_checkpoint"]
    assert set(ac) <= set(FIELDS["toml_0_2_2"]["activation_checkpoint"])
    assert ac.get("early_stop") is early_stop


FP8 = plan("llama-3.1-8b", 8, parallel=Parallel(dp=8), zero_stage=3, precision=Precision.FP8,
           batch=Batch(1, 32))


def test_toml_fp8_swaps_in_float8_linears_but_the_head():
    """0.2.2 looks each [model] converters name up in its registry, where the Float8Linear swap
    is "quantize.linear.float8" (components/quantization/float8.py register_model_converter),
    configured by [quantize.linear.float8] (job_config.Float8Linear: filter_fqns, ...); the
    output head stays 16-bit as autoplan prices an fp8 run."""
    doc = tomllib.loads(_export(FP8, "toml"))
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"] == {"linear": {"float8": {"filter_fqns": ["output"]}}}
    assert doc["training"]["mixed_precision_param"] == "bfloat16"
    with pytest.raises(ConfigError, match="fp8 only through FSDP"):  # mixed precision via FSDP
        _export(FP8.replace(zero_stage=0), "toml")


def test_an_fp8_plan_without_fsdp_is_told_to_shard_not_to_train_in_fp32():
    """The refusal told an fp8 plan "shard over dp, or set precision fp32" (the user test's
    finding 17): sharding is what keeps fp8; bf16 would not help (it needs FSDP as well)."""
    with pytest.raises(ConfigError) as err:
        _export(FP8.replace(zero_stage=0), "toml")
    assert ("shard over dp (zero_stage 2 or 3 with dp > 1) to train it in fp8; only precision "
            "fp32 runs without FSDP (bf16 needs it as fp8 does)") in str(err.value)
    with pytest.raises(ConfigError) as err:
        _export(FP8.replace(zero_stage=0, precision=Precision.BF16), "toml")
    assert "shard over dp (zero_stage 2 or 3 with dp > 1), or set precision fp32" in \
        str(err.value)


def test_python_fp8_builds_the_model_with_float8_linears_but_the_head(monkeypatch):
    """0.3.0: model_registry(converters=[Float8LinearConverter.Config(...)]), as its own
    llama3_405b() does (lm_head left out)."""
    config = _run_python(FP8, monkeypatch)
    [converter] = sys.modules["torchtitan.models.llama3"].converters  # what model_registry got
    assert type(converter).__name__ == "Config" and converter.kw == {"filter_fqns": ["lm_head"]}
    assert config.values["model_spec"] == "spec:8B"


def test_python_config_keeps_torch_compile_off_even_from_the_405b_base(monkeypatch):
    """0.3.0's llama3_405b() sets CompileConfig(enable=True, enable_async_tensor_parallel=True);
    the torchtitan runtime autoplan prices is eager."""
    p = plan("llama-3.1-405b", 512, parallel=Parallel(dp=8, tp=8, pp=8), sequence_parallel=True,
             zero_stage=3, recompute=Recompute(RecomputePolicy.FULL), batch=Batch(1, 512),
             pipeline=Pipeline(Schedule.ONE_F_ONE_B, 1, (15,) + (16,) * 6 + (15,)))
    source = _export(p, "python")
    assert "config = config_registry.llama3_405b()" in source
    config = _run_python(p, monkeypatch)
    assert type(config.values["compile"]).__name__ == "CompileConfig"
    assert config.values["compile"].kw == {}  # enable and async TP at their False defaults


def test_toml_quotes_model_names_beyond_the_basic_plane():
    """TOML's \\uXXXX escapes must be Unicode scalar values: JSON's surrogate pairs for
    characters outside the BMP are not, so they stay literal (UTF-8)."""
    from autoplan.model_spec import PRESETS

    named = PRESETS["llama-3.1-8b"].replace(name='llama-3-8b-\U0001f680 "x"')
    p = plan(named, 8, parallel=Parallel(dp=8), zero_stage=3, batch=Batch(1, 32))
    doc = tomllib.loads(_export(p, "toml"))
    assert doc["job"]["description"] == 'autoplan plan for llama-3-8b-\U0001f680 "x"'


def test_a_model_at_another_epsilon_is_defined_at_it_or_said(monkeypatch):
    """torchtitan's Llama 3 flavors normalise at 1e-5 (RMSNorm.Config's default, which
    _build_llama3_layers leaves): Llama-3.1-8B's shape at 1e-6 is defined at its own shape in the
    Python config, its block norms and final norm set to 1e-6; the TOML, which names a flavor
    and has no such field, says in its header that it trains at 1e-5."""
    model = plan("llama-3.1-8b").model_spec().replace(name="llama3-eps6", norm_eps=1e-6)
    p = plan(model, 16, zero_stage=2, batch=Batch(1, 64))
    assert flavor(model) == ("8B", "llama3_8b")  # the shape alone matches
    kind, name, built = _run_python(p, monkeypatch).values["model_spec"]
    assert (kind, name) == ("spec", "autoplan-llama3-eps6")
    assert len(built.layers) == 32 and built.norm.eps == 1e-6
    assert {(b.attention_norm.eps, b.ffn_norm.eps) for b in built.layers} == {(1e-6, 1e-6)}
    text = _export(p, "toml")
    assert tomllib.loads(text)["model"] == {"name": "llama3", "flavor": "8B"}
    assert "# The model's norms normalise at eps 1e-06 (norm_eps); torchtitan's llama3 " \
           "builds them at 1e-05," in text
    registered = _export(plan("llama-3.1-8b", 16, zero_stage=2, batch=Batch(1, 64)), "python")
    assert "eps" not in registered and "norm_eps" not in _export(
        plan("llama-3.1-8b", 16, zero_stage=2, batch=Batch(1, 64)), "toml")
