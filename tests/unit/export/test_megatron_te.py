"""What Transformer Engine runs for the Megatron export (export/megatron_te.py): fp8 GEMMs in a
bf16 run, the cuDNN fused attention backend, the all-gather context-parallel exchange; parsed
by Megatron's own flag definitions, imported back, and one-line refusals of what TE cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.registry import get_target
from autoplan.plan import Attention, Batch, Parallel, Plan, Precision

from .cases import plan
from .consumers import megatron_parser, run_script


def _args(tmp_path: Path, p: Plan):
    """Megatron's parser on the argv the exported script hands pretrain_gpt.py."""
    path = tmp_path / "megatron_args.sh"
    path.write_text(export_plan(get_target("megatron"), p, p.model_spec(),
                                ExportOptions(gpus_per_node=8))["megatron_args.sh"])
    [call] = run_script(path, {"torchrun": ""})
    return megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:]), path


def _refusal(p: Plan) -> str:
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    return str(err.value)


FP8 = plan("llama-3-8b", 8, parallel=Parallel(dp=4, tp=2), sequence_parallel=True,
           zero_stage=1, precision=Precision.FP8, batch=Batch(1, 32))


def test_fp8_runs_bf16_with_hybrid_fp8_gemms_and_imports_back(tmp_path: Path):
    # without --bf16/--fp16 Megatron trains in fp32 (validate_args: params_dtype = torch.float)
    ns, path = _args(tmp_path, FP8)
    assert ns.bf16 and not ns.fp16 and ns.fp8_format == "hybrid"
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back == FP8


def test_fp8_experts_keep_grouped_gemm_valid(tmp_path: Path):
    # validate_args: `if args.moe_grouped_gemm: assert args.bf16`
    moe = plan("mixtral-8x7b", 16, parallel=Parallel(dp=2, tp=8, ep=2, etp=1),
               sequence_parallel=True, zero_stage=1, precision=Precision.FP8,
               batch=Batch(1, 32))
    ns, _ = _args(tmp_path, moe)
    assert ns.moe_grouped_gemm and ns.bf16 and ns.fp8_format == "hybrid"


def test_import_refuses_fp8_outside_a_bf16_run(tmp_path: Path):
    script = tmp_path / "args.txt"
    script.write_text("--micro-batch-size 1 --fp16 --fp8-format hybrid\n")
    with pytest.raises(ConfigError, match="--fp8-format: without --bf16"):
        import_megatron(script, model="gpt3-1.3b", cluster="h100-sxm-80gb", num_gpus=8)


def test_flash_attention_is_te_fused_attention(tmp_path: Path):
    # `flash` would set NVTE_FUSED_ATTN=0 (language_module._set_attention_backend): FA2, not the
    # cuDNN kernel the megatron runtime prices (attention_kernel cudnn)
    ns, _ = _args(tmp_path, FP8.replace(precision=Precision.BF16))
    assert ns.attention_backend == "fused"
    eager, _ = _args(tmp_path, FP8.replace(attention=Attention.EAGER))
    assert eager.attention_backend == "unfused"


def test_latent_attention_exports_with_fused_attention(tmp_path: Path):
    """TE's FusedAttention runs MLA (head_dim_qk != head_dim_v) with separate q, k, v
    (get_attention_backend: disabled only for other qkv layouts, and on sm120)."""
    ns, _ = _args(tmp_path, plan("deepseek-v3", 64, parallel=Parallel(dp=64, ep=64),
                                 zero_stage=1, batch=Batch(1, 256)))
    assert ns.multi_latent_attention and ns.attention_backend == "fused"


@pytest.mark.parametrize(("p", "field"), [
    (plan("gpt3-1.3b", 8, parallel=Parallel(dp=8), zero_stage=1, precision=Precision.FP32),
     "precision fp32 with attention flash"),
    (plan("llama-3-8b", 8, parallel=Parallel(dp=2, tp=2, cp=2), sequence_parallel=True,
          zero_stage=1, attention=Attention.EAGER, batch=Batch(1, 16)),
     "attention eager with cp=2"),
    (plan("deepseek-v3", 128, parallel=Parallel(dp=64, cp=2, ep=64), zero_stage=1,
          batch=Batch(1, 256)), "model.mla with cp=2"),
])
def test_what_transformer_engine_cannot_run_is_refused(p: Plan, field: str):
    assert field in _refusal(p)


def test_context_parallelism_runs_the_p2p_ring(tmp_path: Path):
    # the megatron runtime prices cp as Transformer Engine's P2P ring (cp_exchange te-p2p),
    # Megatron's default --cp-comm-type, written out so the run does not lean on the default
    pytest.importorskip("megatron.core")
    import inspect

    from megatron.core.transformer import TransformerConfig

    p = plan("llama-3-70b", 64, parallel=Parallel(dp=4, tp=8, cp=2), sequence_parallel=True,
             zero_stage=1, batch=Batch(1, 64))
    ns, _ = _args(tmp_path, p)
    assert ns.cp_comm_type == ["p2p"]
    assert '"p2p"' in inspect.getsource(TransformerConfig)  # cp_comm_type's doc
    flat, _ = _args(tmp_path, p.replace(parallel=Parallel(dp=8, tp=8)))
    assert flat.cp_comm_type is None
