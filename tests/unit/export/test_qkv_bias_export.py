"""A model with q, k and v biases alone (model.qkv_bias, Qwen2) exported: Megatron-LM gets
`--disable-bias-linear --add-qkv-bias` (Megatron-Core builds linear_qkv with
bias=add_bias_linear or add_qkv_bias), reads back to the same plan and builds the parameters
autoplan prices; targets without the layer refuse it in one line naming the field."""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from autoplan.cost.params import total_params
from autoplan.errors import ConfigError
from autoplan.export.importers import import_megatron
from autoplan.model_spec import PRESETS, ModelSpec
from autoplan.plan import Batch, Parallel

from .cases import plan
from .consumers import export_files, launch_argv, megatron_core_model, megatron_parser

QWEN = PRESETS["llama-3-8b"].replace(name="qwen-like-8b", qkv_bias=True)
TINY_QWEN = PRESETS["tiny-llama"].replace(name="tiny-qwen2", num_layers=2, qkv_bias=True)
TP2 = dict(parallel=Parallel(dp=8, tp=2), sequence_parallel=True, zero_stage=1)


def test_megatron_gets_both_flags_and_parses_them(tmp_path) -> None:
    path = export_files(tmp_path, "megatron", plan(QWEN, 16, **TP2))["megatron_args.sh"]
    argv = launch_argv(path)
    assert argv.count("--disable-bias-linear") == 1 and argv.count("--add-qkv-bias") == 1
    ns = megatron_parser().parse_args(argv)
    assert ns.disable_bias_linear and ns.add_qkv_bias
    llama = export_files(tmp_path, "megatron", plan("llama-3-8b", 16, **TP2))["megatron_args.sh"]
    assert "--add-qkv-bias" not in launch_argv(llama)  # bias-free: no q, k, v bias


def test_megatron_export_imports_back_equal_and_silent(tmp_path, caplog) -> None:
    p = plan(QWEN, 16, **TP2)
    path = export_files(tmp_path, "megatron", p)["megatron_args.sh"]
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert [r.getMessage() for r in caplog.records] == []
    assert back.model_spec() == QWEN
    assert back == p.replace(model=back.model)


@pytest.mark.parametrize(("model", "edit", "said"), [
    (QWEN, lambda t: t.replace(" --add-qkv-bias", "").replace("--add-qkv-bias\n", ""),
     "--add-qkv-bias: the launch builds no bias, --model qwen-like-8b has q, k and v biases "
     "alone; add --add-qkv-bias to the launch (it trains qwen-like-8b without its q, k and v "
     "biases), or "),
    (PRESETS["llama-3-8b"], lambda t: t,
     "--add-qkv-bias: the launch builds q, k and v biases alone, --model llama-3-8b has no "
     "bias"),
])
def test_a_model_given_with_other_q_k_v_biases_is_refused(tmp_path, model, edit, said) -> None:
    path = export_files(tmp_path, "megatron", plan(QWEN, 16, **TP2))["megatron_args.sh"]
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model=model, cluster="h100-sxm-80gb", num_gpus=None)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_megatron_core_builds_the_parameters_autoplan_prices(tmp_path) -> None:
    """The exported flags, parsed by Megatron's flag table, build Megatron-Core's GPTModel
    with autoplan's parameter count: q, k and v's biases in linear_qkv, none elsewhere."""
    pytest.importorskip("megatron.core")
    p = plan(TINY_QWEN, 8, parallel=Parallel(dp=8), batch=Batch(1, 8), zero_stage=1)
    argv = launch_argv(export_files(tmp_path, "megatron", p)["megatron_args.sh"])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        built = ex.submit(megatron_core_model, argv).result(timeout=300)
    count, names = built["params"], built["biases"]
    assert names == [f"decoder.layers.{i}.self_attention.linear_qkv.bias" for i in range(2)]
    assert count == total_params(TINY_QWEN)
    assert count - total_params(TINY_QWEN.replace(qkv_bias=False)) == 2 * (64 + 2 * 32)


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_torchtitan_refuses_in_one_line_naming_the_field(tmp_path, fmt) -> None:
    """torchtitan's Llama 3 Attention builds wq, wk, wv and wo with bias=False."""
    with pytest.raises(ConfigError) as err:
        export_files(tmp_path, "torchtitan", plan(QWEN, 16, batch=Batch(1, 64), zero_stage=2), fmt)
    text = str(err.value)
    assert "model.qkv_bias: q, k and v biases (none)" in text and "\n" not in text


def test_torchtitan_moe_refuses_a_qwen2_moe_style_model(tmp_path) -> None:
    qwen2_moe = PRESETS["qwen3-30b-a3b"].replace(name="qwen2-moe-like", qkv_bias=True)
    with pytest.raises(ConfigError, match="model.qkv_bias: torchtitan's MoE models have no q, "
                                          "k and v biases; export to megatron"):
        export_files(tmp_path, "torchtitan", plan(qwen2_moe, 64, parallel=Parallel(dp=64, ep=8),
                                             batch=Batch(1, 64), zero_stage=2))


def test_megatron_deepspeed_refuses_and_plain_deepspeed_names_it(tmp_path) -> None:
    """Megatron-DeepSpeed (f1feb88) has --disable-bias-linear and no --add-qkv-bias: a tp plan
    is refused; a plain ZeRO launch runs the user's code, told in the launch's comment."""
    with pytest.raises(ConfigError) as err:
        export_files(tmp_path, "deepspeed", plan(QWEN, 16, **TP2))
    assert "model.qkv_bias: Megatron-DeepSpeed biases every Linear or none" in str(err.value)
    assert "export to megatron (--add-qkv-bias)" in str(err.value)
    launch = export_files(tmp_path, "deepspeed", plan(QWEN, 16, zero_stage=1))["launch.sh"]
    assert "bias q, k and v only, tied embeddings false" in launch.read_text()


def test_the_test_models_are_what_they_say() -> None:
    assert isinstance(QWEN, ModelSpec) and QWEN.qkv_bias and not QWEN.bias
    assert total_params(QWEN) - total_params(PRESETS["llama-3-8b"]) == 32 * (4096 + 2 * 1024)
