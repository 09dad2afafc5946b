"""Llama 3.1's RoPE scaling (model.rope_scaling) in the exports: Megatron's --use-rope-scaling
and --rope-scaling-factor, parsed by Megatron's own flag table and read back by the importer
(a --model that scales otherwise is refused); DeepSpeed's launches name it in their comment;
torchtitan's Llama 3 flavors, which all scale, are used only for a model that scales as they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.registry import get_target
from autoplan.model_spec import PRESETS, RopeScaling
from autoplan.plan import Parallel

from .cases import plan
from .consumers import megatron_parser, run_script

OPTS = ExportOptions(gpus_per_node=8)
LLAMA31 = PRESETS["llama-3.1-8b"]
CLUSTER = "h100-sxm-80gb"


def _megatron(tmp_path: Path, model) -> Path:
    p = plan(model, 8, parallel=Parallel(dp=4, tp=2), sequence_parallel=True, zero_stage=1)
    path = tmp_path / "megatron_args.sh"
    path.write_text(export_plan(get_target("megatron"), p, p.model_spec(),
                                OPTS)["megatron_args.sh"])
    return path


@pytest.mark.parametrize("model", [LLAMA31, LLAMA31.replace(
    name="llama-3.2-scaled", rope_scaling=RopeScaling(factor=32.0))], ids=["8", "32"])
def test_megatron_writes_the_scaling_and_reads_it_back(tmp_path, model):
    path = _megatron(tmp_path, model)
    [call] = run_script(path, {"torchrun": ""})
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.use_rope_scaling and ns.rope_scaling_factor == model.rope_scaling.factor
    back = import_megatron(path, model=None, cluster=CLUSTER, num_gpus=None)
    assert back.model_spec().rope_scaling == model.rope_scaling
    assert back.model_spec() == model  # the preset's name comes back for llama-3.1-8b


def test_an_unscaled_model_writes_no_scaling(tmp_path):
    text = _megatron(tmp_path, PRESETS["llama-3-8b"]).read_text()
    assert "--use-rope-scaling" not in text and "--rope-scaling-factor" not in text


def test_a_model_that_scales_otherwise_than_the_launch_is_refused(tmp_path):
    path = _megatron(tmp_path, LLAMA31)
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model="llama-3-8b", cluster=CLUSTER, num_gpus=None)
    assert err.value.field.endswith("--use-rope-scaling")
    assert err.value.problem == (
        "the launch rotates with Llama 3.1's scaling (factor 8, low_freq_factor 1, "
        "high_freq_factor 4, original_max_position_embeddings 8192), --model llama-3-8b with "
        "no scaling")
    path.write_text(path.read_text().replace("  --use-rope-scaling\n", ""))
    with pytest.raises(ConfigError, match="the launch rotates with no scaling, --model "
                                          "llama-3.1-8b with Llama 3.1's scaling \\(factor 8"):
        import_megatron(path, model="llama-3.1-8b", cluster=CLUSTER, num_gpus=None)
    assert import_megatron(path, model="llama-3-8b", cluster=CLUSTER,
                           num_gpus=None).model_spec().rope_scaling is None


def test_a_factor_below_one_is_refused_naming_the_flag(tmp_path):
    path = _megatron(tmp_path, LLAMA31)
    path.write_text(path.read_text().replace("--rope-scaling-factor 8.0",
                                             "--rope-scaling-factor 0.5"))
    with pytest.raises(ConfigError, match="--rope-scaling-factor: got 0.5"):
        import_megatron(path, model=None, cluster=CLUSTER, num_gpus=None)


def test_megatron_refuses_a_band_megatron_core_does_not_scale_by():
    model = LLAMA31.replace(rope_scaling=RopeScaling(high_freq_factor=8.0))
    reasons = get_target("megatron").check(plan(model, 8), model, OPTS)
    assert any(r.startswith("model.rope_scaling (1.0, 8.0, 8192)") and "(1.0, 4.0, 8192) "
               "fixed" in r for r in reasons), reasons


@pytest.mark.parametrize("par", [Parallel(dp=16), Parallel(dp=8, tp=2)],
                         ids=["plain", "megatron-deepspeed"])
def test_deepspeed_names_the_scaling_in_its_comment(par):
    p = plan("llama-3.1-8b", 16, parallel=par, sequence_parallel=par.tp > 1, zero_stage=1)
    launch = export_plan(get_target("deepspeed"), p, p.model_spec(), OPTS)["launch.sh"]
    assert ("with Llama 3.1's scaling (factor 8, low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192)") in launch


LLAMA3 = PRESETS["llama-3-8b"]
TOML = ExportOptions(gpus_per_node=8, torchtitan_format="toml")
PYTHON = ExportOptions(gpus_per_node=8, torchtitan_format="python")


def _titan(model, opts: ExportOptions) -> str:
    p = plan(model, 8, parallel=Parallel(dp=8), zero_stage=3)
    return next(iter(export_plan(get_target("torchtitan"), p, p.model_spec(), opts).values()))


def test_torchtitan_flavors_are_llama_31_models():
    """torchtitan 0.2.2 and 0.3.0 rotate every Llama 3 flavor with Llama 3.1's scaling at
    factor 8 (their RoPEScalingArgs / ComplexRoPE defaults): llama-3.1 presets are flavors,
    llama-3 (no scaling) and a factor-32 model (Llama 3.2's) of the same shapes are not."""
    from autoplan.export.torchtitan import flavor

    assert flavor(LLAMA31) == ("8B", "llama3_8b")
    assert flavor(PRESETS["llama-3.1-70b"]) == ("70B", "llama3_70b")
    assert flavor(LLAMA3) is None and flavor(PRESETS["llama-3-70b"]) is None
    assert flavor(LLAMA31.replace(rope_scaling=RopeScaling(factor=32.0))) is None


def test_torchtitan_toml_refuses_a_model_its_flavor_would_scale():
    with pytest.raises(ConfigError, match="with Llama 3.1's RoPE scaling, factor 8"):
        _titan(LLAMA3, TOML)
    assert 'flavor = "8B"' in _titan(LLAMA31, TOML)


def test_torchtitan_python_defines_the_model_at_its_own_rotation():
    """llama-3-8b gets a flavor of its own shape rotating without scaling (ComplexRoPE's
    default); a scaled model of an unregistered shape passes its scaling to ComplexRoPE."""
    unscaled = _titan(LLAMA3, PYTHON)
    assert "max_seq_len=8192, theta=500000.0)," in unscaled and "scaling=" not in unscaled
    assert 'model_registry("8B"' not in unscaled
    odd = PRESETS["llama-2-13b"].replace(name="llama-2-13b-scaled", rope_theta=500000.0,
                                         rope_scaling=RopeScaling(factor=4.0))
    text = _titan(odd, PYTHON)
    assert ('theta=500000.0, scaling="llama", scaling_factor=4.0, low_freq_factor=1.0, '
            "high_freq_factor=4.0, original_max_position_embeddings=8192)") in text


def test_torchtitan_python_scaling_arguments_are_complex_ropes():
    """The keywords written are ComplexRoPE.Config's fields in torchtitan 0.3.0
    (models/common/rope.py RoPE.Config), where the wheel is installed."""
    rope = pytest.importorskip("torchtitan.models.common.rope")
    import dataclasses

    names = {f.name for f in dataclasses.fields(rope.ComplexRoPE.Config)}
    assert {"theta", "max_seq_len", "scaling", "scaling_factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"} <= names


def test_torchtitan_moe_flavors_refuse_llama_31_scaling():
    qwen = PRESETS["qwen3-30b-a3b"]
    p = plan(qwen, 8, parallel=Parallel(dp=8))
    why = get_target("torchtitan").check(p, qwen.replace(rope_scaling=RopeScaling()), OPTS)
    assert ("model.rope_scaling: the model rotates with Llama 3.1's scaling (factor 8, "
            "low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192), "
            "torchtitan's qwen3 30B-A3B with no scaling; export to megatron") in why
    assert not any("rope_scaling" in r for r in get_target("torchtitan").check(p, qwen, OPTS))


def test_a_factor_without_the_switch_is_said_ignored(tmp_path, caplog):
    """Megatron scales only under --use-rope-scaling: a factor alone was read silently as an
    unscaled model; it still is (as Megatron runs it), and the import says the factor is
    ignored, as it says other flags Megatron ignores."""
    import logging

    path = _megatron(tmp_path, LLAMA31)
    path.write_text(path.read_text().replace("  --use-rope-scaling\n", ""))
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster=CLUSTER, num_gpus=None)
    assert back.model_spec().rope_scaling is None
    said = [r.getMessage() for r in caplog.records if "--rope-scaling-factor" in r.getMessage()]
    assert said == [f"megatron arguments {path}: --rope-scaling-factor 8.0 without "
                    "--use-rope-scaling ignored, as Megatron ignores it: the model rotates "
                    "unscaled (add --use-rope-scaling if the run scales)"]
    caplog.clear()
    path = _megatron(tmp_path, LLAMA31)  # with the switch: read, nothing said
    with caplog.at_level(logging.WARNING):
        import_megatron(path, model=None, cluster=CLUSTER, num_gpus=None)
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]


def test_megatron_deepspeed_names_the_scaling_it_must_apply():
    """Its comment said to use "that base" only, the scaling left out of what to check."""
    p = plan("llama-3.1-8b", 16, parallel=Parallel(dp=8, tp=2), sequence_parallel=True,
             zero_stage=1)
    launch = export_plan(get_target("deepspeed"), p, p.model_spec(), OPTS)["launch.sh"]
    assert ("# make sure Megatron-DeepSpeed's rotary embedding uses that base and applies that "
            "scaling.") in launch
    unscaled = plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2), sequence_parallel=True,
                    zero_stage=1)
    launch = export_plan(get_target("deepspeed"), unscaled, unscaled.model_spec(),
                         OPTS)["launch.sh"]
    assert "scaling" not in launch and "uses that base." in launch


def test_rope_flags_on_a_learned_position_model_are_said_ignored():
    from autoplan.export.megatron_model import ignored_rope_flags

    said = ignored_rope_flags("--position-embedding-type learned_absolute --rotary-base 500000 "
                              "--rope-scaling-factor 8", "args")
    assert said == ["--rotary-base --rope-scaling-factor ignored, as Megatron ignores them: "
                    "learned positions rotate nothing (--position-embedding-type rope rotates)"]
    assert ignored_rope_flags("--position-embedding-type learned_absolute", "args") == []
