"""The norms exported (model.qk_norm, model.norm_eps): Megatron-LM gets --norm-epsilon always and
--qk-layernorm for QK-norm (and for latent attention's latent norms), reads both back to the same
plan and builds the parameters autoplan prices; Megatron-DeepSpeed gets --layernorm-epsilon and
refuses QK-norm; torchtitan refuses QK-norm on its Llama 3, requires it on its qwen3 flavors and
says the epsilon it trains at where the file cannot set it."""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from autoplan.cost.params import total_params
from autoplan.errors import ConfigError
from autoplan.export.importers import import_deepspeed, import_megatron
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, Parallel

from .cases import plan
from .consumers import (
    export_files,
    flags_parser,
    launch_argv,
    megatron_core_model,
    megatron_parser,
)

QWEN3_DENSE = PRESETS["llama-3-8b"].replace(name="qwen3-like-8b", qk_norm=True, norm_eps=1e-6)
TINY_QWEN3 = PRESETS["tiny-llama"].replace(name="tiny-qwen3", num_layers=2, qk_norm=True,
                                           norm_eps=1e-6)
MOE = dict(parallel=Parallel(dp=16, ep=8), batch=Batch(1, 64), zero_stage=1)
TP2 = dict(parallel=Parallel(dp=8, tp=2), sequence_parallel=True, zero_stage=1)


@pytest.mark.parametrize(("model", "eps", "qk"), [
    ("qwen3-30b-a3b", 1e-6, True),  # Qwen3's QK-norm
    ("deepseek-v3", 1e-6, True),  # MLA's latent norms (q_layernorm, kv_layernorm)
    ("mixtral-8x7b", 1e-5, False),
])
def test_megatron_writes_the_epsilon_and_qk_layernorm(tmp_path, model, eps, qk) -> None:
    """The user test's Qwen3 export wrote neither (Megatron's defaults: 1e-5, no QK-norm)."""
    argv = launch_argv(export_files(tmp_path, "megatron", plan(model, 16, **MOE))["megatron_args.sh"])
    ns = megatron_parser().parse_args(argv)
    assert (ns.norm_epsilon, ns.qk_layernorm) == (eps, qk)
    assert argv.count("--norm-epsilon") == 1


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "llama-3-8b"])
def test_megatron_export_imports_back_equal_and_silent(tmp_path, caplog, model) -> None:
    p = plan(model, 16, **MOE) if model != "llama-3-8b" else plan(model, 16, **TP2)
    path = export_files(tmp_path, "megatron", p)["megatron_args.sh"]
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert [r.getMessage() for r in caplog.records] == []
    assert back == p  # the preset's name: the flags build exactly the preset


def test_a_dense_qwen3_model_imports_back_inline(tmp_path) -> None:
    p = plan(QWEN3_DENSE, 16, **TP2)
    path = export_files(tmp_path, "megatron", p)["megatron_args.sh"]
    back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert back.model_spec() == QWEN3_DENSE


def _drop(flag: str):
    return lambda text: "\n".join(ln for ln in text.splitlines() if flag not in ln) + "\n"


@pytest.mark.parametrize(("edit", "model", "said"), [
    (_drop("--qk-layernorm"), "qwen3-30b-a3b",
     "--qk-layernorm: the launch does not normalise q and k per head, --model qwen3-30b-a3b does "
     "(qk_norm); add --qk-layernorm to the launch (it trains qwen3-30b-a3b without its "
     "QK-norm), or drop --model"),
    (lambda t: t, PRESETS["qwen3-30b-a3b"].replace(name="no-qk", qk_norm=False),
     "--qk-layernorm: the launch normalises q and k per head, --model no-qk does not"),
    (lambda t: t.replace("--norm-epsilon 1e-06", "--norm-epsilon 1e-5"), "qwen3-30b-a3b",
     "--norm-epsilon: 1e-05 but --model qwen3-30b-a3b normalises at 1e-06; add --norm-epsilon "
     "1e-06 to the launch if it trains qwen3-30b-a3b, or drop --model"),
    (_drop("--norm-epsilon"), "qwen3-30b-a3b",
     "--norm-epsilon: absent: the default 1e-05, but --model qwen3-30b-a3b normalises at 1e-06"),
])
def test_a_model_given_with_other_norms_is_refused(tmp_path, edit, model, said) -> None:
    path = export_files(tmp_path, "megatron", plan("qwen3-30b-a3b", 16, **MOE))["megatron_args.sh"]
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model=model, cluster="h100-sxm-80gb", num_gpus=None)
    assert said in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_layernorm_qk_norm_and_a_bad_epsilon_are_refused_naming_the_flag(tmp_path) -> None:
    path = export_files(tmp_path, "megatron", plan(QWEN3_DENSE, 16, **TP2))["megatron_args.sh"]
    text = path.read_text()
    path.write_text(text.replace("--normalization RMSNorm", "--normalization LayerNorm"))
    with pytest.raises(ConfigError, match=r"--qk-layernorm: with --normalization LayerNorm"):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    path.write_text(text.replace("--norm-epsilon 1e-06", "--norm-epsilon 0"))
    with pytest.raises(ConfigError, match=r"--norm-epsilon: got 0.0; expected a positive"):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)


def test_latent_attention_without_qk_layernorm_is_said(tmp_path, caplog) -> None:
    """Megatron builds MLA's latent norms only under --qk-layernorm (IdentityOp without it);
    autoplan's MLA always has them: the import says it prices them."""
    path = export_files(tmp_path, "megatron", plan("deepseek-v3", 16, **MOE))["megatron_args.sh"]
    path.write_text(_drop("--qk-layernorm")(path.read_text()))
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().mla is not None and not back.model_spec().qk_norm
    said = [r.getMessage() for r in caplog.records]
    assert any("--multi-latent-attention without --qk-layernorm builds no latent norms" in m
               for m in said), said


def test_megatron_core_builds_the_norms_autoplan_prices(tmp_path) -> None:
    """The exported flags, parsed by Megatron's flag table, build Megatron-Core's GPTModel with
    autoplan's parameter count: a head_dim-wide q and k norm per block, at the model's eps."""
    pytest.importorskip("megatron.core")
    p = plan(TINY_QWEN3, 8, parallel=Parallel(dp=8), batch=Batch(1, 8), zero_stage=1)
    argv = launch_argv(export_files(tmp_path, "megatron", p)["megatron_args.sh"])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        built = ex.submit(megatron_core_model, argv).result(timeout=300)
    count, norms = built["params"], built["norms"]
    assert [n for n, _ in norms] == [f"decoder.layers.{i}.self_attention.{q}_layernorm"
                                     for i in range(2) for q in "qk"]
    assert {eps for _, eps in norms} == {1e-6}
    assert count == total_params(TINY_QWEN3)
    assert count - total_params(TINY_QWEN3.replace(qk_norm=False)) == 2 * 2 * 16


def test_megatron_deepspeed_writes_its_epsilon_flag_and_refuses_qk_norm(tmp_path) -> None:
    """Megatron-DeepSpeed (f1feb88): --layernorm-epsilon, which its RMSNorm takes too, and no
    QK-norm; a plain ZeRO launch runs the user's code, told in the launch's comment."""
    llama = PRESETS["llama-3-8b"].replace(name="llama-eps6", norm_eps=1e-6)
    one_node = dict(TP2, parallel=Parallel(dp=4, tp=2), batch=Batch(1, 64))
    launch = export_files(tmp_path, "deepspeed", plan(llama, 8, **one_node))["launch.sh"]
    ns, _ = flags_parser("megatron_deepspeed_flags.yaml").parse_known_args(
        launch_argv(launch))
    assert ns.layernorm_epsilon == 1e-6
    back = import_deepspeed(launch, model=llama, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec() == llama
    with pytest.raises(ConfigError, match=r"--layernorm-epsilon: 1e-06 but --model llama-3-8b "
                                          r"normalises at 1e-05"):
        import_deepspeed(launch, model="llama-3-8b", cluster="h100-sxm-80gb", num_gpus=None)
    with pytest.raises(ConfigError) as err:
        export_files(tmp_path, "deepspeed", plan(QWEN3_DENSE, 16, **TP2))
    assert "model.qk_norm: Megatron-DeepSpeed has no per-head q and k norms" in str(err.value)
    assert "export to megatron (--qk-layernorm)" in str(err.value)
    plain = export_files(tmp_path, "deepspeed", plan(QWEN3_DENSE, 16, zero_stage=1))["launch.sh"]
    assert ("rmsnorm at eps 1e-06 (q and k RMS-normalised per head before RoPE: qk_norm)"
            in plain.read_text())


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_torchtitan_llama3_refuses_qk_norm_in_one_line(tmp_path, fmt) -> None:
    """torchtitan's Llama 3 Attention has no q_norm or k_norm."""
    with pytest.raises(ConfigError) as err:
        export_files(tmp_path, "torchtitan", plan(QWEN3_DENSE, 16, batch=Batch(1, 64),
                                             zero_stage=2), fmt)
    text = str(err.value)
    assert "model.qk_norm: q and k normalised per head (none)" in text and "\n" not in text


def test_torchtitan_qwen3_flavor_requires_qk_norm(tmp_path) -> None:
    """torchtitan's qwen3 30B-A3B builds q_norm and k_norm (Qwen3ModelArgs qk_norm True): the
    preset, which has them now, is its flavor; a model without them is refused."""
    tt = dict(parallel=Parallel(dp=64, ep=8), batch=Batch(1, 64), zero_stage=2)
    files = export_files(tmp_path, "torchtitan", plan("qwen3-30b-a3b", 64, **tt))
    assert "model_registry('30B-A3B')" in files["autoplan_torchtitan.py"].read_text()
    no_qk = PRESETS["qwen3-30b-a3b"].replace(name="qwen3-no-qk", qk_norm=False)
    with pytest.raises(ConfigError, match=r"model.qk_norm=false: torchtitan's qwen3 30B-A3B "
                                          r"normalises q and k per head"):
        export_files(tmp_path, "torchtitan", plan(no_qk, 64, **tt))


@pytest.mark.parametrize("fmt", ["python", "toml"])
def test_torchtitan_says_the_epsilon_it_trains_at(tmp_path, fmt) -> None:
    """deepseek_v3's flavor builds its norms at 1e-5 whatever the file says; DeepSeek-V3 (and
    the preset) normalise at 1e-6: the header says so. Qwen3's flavor is at Qwen3's 1e-6."""
    tt = dict(parallel=Parallel(dp=64, ep=8), batch=Batch(1, 64), zero_stage=2)
    ds = PRESETS["deepseek-v3"].replace(mtp_layers=0, seq_len=8192)
    [text] = [p.read_text() for p in export_files(tmp_path, "torchtitan", plan(ds, 64, **tt),
                                             fmt).values()]
    assert "norms normalise at eps 1e-06 (norm_eps); torchtitan's deepseek_v3 671B builds " \
           "them at 1e-05," in text
    [qwen] = [p.read_text() for p in export_files(tmp_path, "torchtitan",
                                             plan("qwen3-30b-a3b", 64, **tt), "python").values()]
    assert "norm_eps" not in qwen
