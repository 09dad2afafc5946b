"""Megatron export and import of MoE and MLA plans: Megatron's own flag definitions parse the
arguments, Megatron-Core's TransformerConfig validates the MoE fields, export -> import ->
export round-trips, and what Megatron cannot run is refused in one line."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.megatron_moe import layer_freq
from autoplan.export.registry import get_target
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan

from .consumers import megatron_parser, run_script


def _plan(model: str, gpus: int, **par) -> Plan:
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus),
                parallel=Parallel(**par), sequence_parallel=par.get("tp", 1) > 1,
                batch=Batch(micro_batch_size=1, global_batch_size=8 * gpus), zero_stage=1)


MIXTRAL = _plan("mixtral-8x7b", 64, dp=32, tp=2, ep=8)
DEEPSEEK = _plan("deepseek-v3", 16, dp=16, ep=16)


def _export(tmp_path: Path, p: Plan) -> Path:
    files = export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    return path


def _args(tmp_path: Path, p: Plan):
    [call] = run_script(_export(tmp_path, p), {"torchrun": ""})
    script = call.index("pretrain_gpt.py")
    return megatron_parser().parse_args(call[script + 1:])


def test_mixtral_flags_parse_and_megatron_core_validates_them(tmp_path: Path):
    ns = _args(tmp_path, MIXTRAL)
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == (8, 2, 14336)
    assert (ns.expert_model_parallel_size, ns.expert_tensor_parallel_size) == (8, 1)
    assert ns.moe_grouped_gemm and ns.moe_token_dispatcher_type == "alltoall"
    assert ns.moe_layer_freq == "1" and ns.moe_router_dtype == "fp32"
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import TransformerConfig
        config = TransformerConfig(
            num_layers=ns.num_layers, hidden_size=ns.hidden_size,
            ffn_hidden_size=ns.ffn_hidden_size, num_attention_heads=ns.num_attention_heads,
            num_query_groups=ns.num_query_groups, gated_linear_unit=ns.swiglu,
            tensor_model_parallel_size=ns.tensor_model_parallel_size,
            sequence_parallel=ns.sequence_parallel, num_moe_experts=ns.num_experts,
            moe_router_topk=ns.moe_router_topk, moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
            expert_model_parallel_size=ns.expert_model_parallel_size,
            expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
            moe_grouped_gemm=ns.moe_grouped_gemm,
            moe_token_dispatcher_type=ns.moe_token_dispatcher_type,
            moe_router_dtype=ns.moe_router_dtype, add_bias_linear=False)
    assert config.num_moe_experts == 8 and config.expert_model_parallel_size == 8


def test_deepseek_v3_writes_mla_and_its_dense_layers(tmp_path: Path):
    ns = _args(tmp_path, DEEPSEEK)
    assert ns.multi_latent_attention
    assert (ns.q_lora_rank, ns.kv_lora_rank, ns.qk_head_dim, ns.qk_pos_emb_head_dim,
            ns.v_head_dim) == (1536, 512, 128, 64, 128)
    assert "--kv-channels" not in _export(tmp_path, DEEPSEEK).read_text()  # MLA says its own
    assert ns.moe_layer_freq == "([0]*3+[1]*58)"
    assert ns.moe_shared_expert_intermediate_size == 2048
    assert ns.moe_router_enable_expert_bias and ns.moe_router_score_function == "sigmoid"


def test_interleaved_layer_pattern_is_written_per_layer():
    m = PRESETS["tiny-moe"]
    spec = m.moe.__class__(8, 2, 128, first_dense_layers=1, layer_freq=2)
    assert layer_freq(m.replace(moe=spec)) == "[0,1,0,1]"


@pytest.mark.parametrize("p", [MIXTRAL, DEEPSEEK], ids=["mixtral", "deepseek-v3"])
def test_export_import_export_round_trips(tmp_path: Path, p: Plan):
    path = _export(tmp_path, p)
    back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert back == p
    assert back.model_spec().moe == PRESETS[str(p.model)].moe
    again = export_plan(get_target("megatron"), back, back.model_spec(),
                        ExportOptions(gpus_per_node=8))
    assert again["megatron_args.sh"] == path.read_text()


def test_moe_with_tp_needs_sequence_parallel():
    p = MIXTRAL.replace(sequence_parallel=False)
    with pytest.raises(ConfigError, match="--sequence-parallel"):
        export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_experts_outside_bf16_are_refused(precision: str):
    """validate_args: `if args.moe_grouped_gemm: assert args.bf16` (every MoE export writes
    --moe-grouped-gemm), and expert parallelism asserts `not args.fp16`."""
    from autoplan.plan import Precision

    p = MIXTRAL.replace(precision=Precision(precision))
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert f"precision {precision} with experts" in str(err.value)
    assert "\n" not in str(err.value)


BASE = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
        "--max-position-embeddings 64 --vocab-size 256 --micro-batch-size 1 "
        "--global-batch-size 8 --swiglu --disable-bias-linear ")


@pytest.mark.parametrize(("extra", "field"), [
    ("--moe-router-topk 2", "--moe-router-topk"),
    ("--num-experts 8 --moe-ffn-hidden-size 128 --moe-layer-freq ([1]*3+[0]*1)",
     "--moe-layer-freq"),
    ("--num-experts 8 --moe-ffn-hidden-size 128 --moe-token-dispatcher-type ring",
     "--moe-token-dispatcher-type"),
])
def test_import_refuses_moe_flags_it_cannot_read(tmp_path: Path, extra: str, field: str):
    path = tmp_path / "args.txt"
    path.write_text(BASE + extra)
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=8)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_import_reads_experts_and_expert_parallelism(tmp_path: Path):
    path = tmp_path / "args.txt"
    path.write_text(BASE + "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 "
                    "--moe-layer-freq ([0]*1+[1]*3) --expert-model-parallel-size 4 "
                    "--moe-grouped-gemm --moe-token-dispatcher-type alltoall")
    p = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=8)
    assert (p.parallel.ep, p.parallel.etp) == (4, 1)
    assert p.model_spec().moe == PRESETS["tiny-moe"].moe


@pytest.mark.parametrize(("flags", "runtime"), [
    ("", "megatron-allgather"),  # Megatron's default dispatcher
    ("--moe-token-dispatcher-type allgather", "megatron-allgather"),
    ("--moe-token-dispatcher-type flex --moe-enable-deepep", "megatron-deepep"),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep",
     "megatron-deepep"),
    ("--moe-token-dispatcher-type flex", None),
    ("--moe-token-dispatcher-type alltoall", ""),
])
def test_import_names_the_runtime_that_prices_its_dispatcher(tmp_path: Path, caplog,
                                                              flags: str, runtime):
    """A plan has no dispatcher (a runtime trait): import says which --runtime prices the
    launch's, in one line, and nothing for alltoall (the megatron preset's own)."""
    path = tmp_path / "args.txt"
    path.write_text(BASE + "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 "
                    "--expert-model-parallel-size 4 --moe-grouped-gemm " + flags)
    with caplog.at_level(logging.WARNING):
        p = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=8)
    assert p.parallel.ep == 4
    said = [r.getMessage() for r in caplog.records if "dispatch" in r.getMessage()]
    if runtime == "":
        assert said == []
    elif runtime is None:
        assert len(said) == 1 and "without DeepEP" in said[0]
    else:
        assert len(said) == 1 and f"--runtime {runtime}" in said[0] and "\n" not in said[0]
        assert ("Megatron's default" in said[0]) == (flags == "")


@pytest.mark.parametrize(  # torchtitan runs DeepSeek-V3 as its 671B flavor: test_torchtitan_moe
    ("target", "p"), [("deepspeed", MIXTRAL), ("deepspeed", DEEPSEEK), ("torchtitan", MIXTRAL)],
    ids=["deepspeed-mixtral", "deepspeed-deepseek-v3", "torchtitan-mixtral"])
def test_targets_without_experts_refuse_in_one_line(target: str, p: Plan):
    with pytest.raises(ConfigError) as err:
        export_plan(get_target(target), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert "export to megatron" in str(err.value) and "\n" not in str(err.value)


def test_moe_recompute_modules_parse_validate_and_round_trip(tmp_path: Path):
    """layernorm + moe_act (Megatron-Bridge's gpt-oss-120b H100 recipe) reach Megatron as
    --recompute-modules, Megatron-Core accepts them with the grouped GEMM the export sets, and
    import reads them back."""
    from autoplan.plan import Recompute, RecomputeModule, RecomputePolicy

    rc = Recompute(policy=RecomputePolicy.SELECTIVE,
                   modules=(RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT))
    p = MIXTRAL.replace(recompute=rc)
    ns = _args(tmp_path, p)
    assert ns.recompute_granularity == "selective"
    assert ns.recompute_modules == ["layernorm", "moe_act"] and ns.moe_grouped_gemm
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import TransformerConfig

        def config(grouped: bool):
            return TransformerConfig(
                num_layers=ns.num_layers, hidden_size=ns.hidden_size,
                num_attention_heads=ns.num_attention_heads, num_moe_experts=ns.num_experts,
                moe_router_topk=ns.moe_router_topk, moe_grouped_gemm=grouped,
                recompute_granularity=ns.recompute_granularity,
                recompute_modules=ns.recompute_modules, add_bias_linear=False)

        assert config(True).recompute_modules == ["layernorm", "moe_act"]
        with pytest.raises(ValueError, match="moe_act"):  # what the grouped GEMM flag is for
            config(False)
    back = import_megatron(_export(tmp_path, p), model=None, cluster=p.cluster.profile,
                           num_gpus=None)
    assert back.recompute == rc


def test_moe_layer_recompute_parses_validates_and_round_trips(tmp_path: Path):
    """layernorm + moe (the Megatron MoE Model Zoo's Qwen3 long-context runs) reach Megatron as
    --recompute-modules, Megatron-Core accepts them, and import reads them back."""
    from autoplan.plan import Recompute, RecomputeModule, RecomputePolicy

    rc = Recompute(policy=RecomputePolicy.SELECTIVE,
                   modules=(RecomputeModule.LAYERNORM, RecomputeModule.MOE))
    p = MIXTRAL.replace(recompute=rc)
    ns = _args(tmp_path, p)
    assert ns.recompute_granularity == "selective"
    assert ns.recompute_modules == ["layernorm", "moe"]
    back = import_megatron(_export(tmp_path, p), model=None, cluster=p.cluster.profile,
                           num_gpus=None)
    assert back.recompute == rc
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import TransformerConfig

        config = TransformerConfig(
            num_layers=ns.num_layers, hidden_size=ns.hidden_size,
            num_attention_heads=ns.num_attention_heads, num_moe_experts=ns.num_experts,
            moe_router_topk=ns.moe_router_topk, moe_grouped_gemm=True,
            recompute_granularity=ns.recompute_granularity,
            recompute_modules=ns.recompute_modules, add_bias_linear=False)
        assert config.recompute_modules == ["layernorm", "moe"]
