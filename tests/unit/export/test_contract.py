"""Every registered export target honours the same contract (STYLE.md habit 7)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, ExportTarget, export_plan, plan_reasons
from autoplan.export.registry import TARGET_NAMES, get_target, targets
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan

from .cases import CASES

TARGETS = list(targets().values())


def test_registry_names_match_the_cli_choices():
    assert tuple(targets()) == TARGET_NAMES
    for target in TARGETS:
        assert isinstance(target, ExportTarget)
        assert target.summary


def test_unknown_target_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown target"):
        get_target("horovod")


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_each_target_expresses_or_refuses_each_plan(target: ExportTarget, case: str):
    plan, expressible = CASES[case]
    model = plan.model_spec()
    opts = ExportOptions(gpus_per_node=8)
    reasons = plan_reasons(plan, model) + target.check(plan, model, opts)
    assert isinstance(reasons, list) and all(isinstance(r, str) and r for r in reasons)
    if target.name not in expressible:
        assert reasons, f"{target.name} should refuse {case}"
        with pytest.raises(ConfigError) as err:
            export_plan(target, plan, model, opts)
        assert "\n" not in str(err.value) and err.value.exit_code == 2
        return
    assert reasons == []
    files = export_plan(target, plan, model, opts)
    assert files and all(isinstance(k, str) and v.strip() for k, v in files.items())
    assert export_plan(target, plan, model, opts) == files  # deterministic


# Every Plan and ModelSpec field, and where each target expresses it. A new field fails this test
# until each target either writes it or refuses plans that set it.
PLAN_FIELDS = {
    "model",
    "cluster",
    "batch",
    "parallel",
    "sequence_parallel",
    "pipeline",
    "zero_stage",
    "offload",
    "recompute",
    "precision",
    "attention",
    "predicted",
    "grad_reduce_dtype",  # megatron and deepspeed write it; torchtitan writes fp32, refuses bf16
}
MODEL_FIELDS = {
    "name",
    "num_layers",
    "hidden_size",
    "num_heads",
    "vocab_size",
    "seq_len",
    "num_kv_heads",
    "ffn_hidden_size",
    "mlp",
    "norm",
    "position",
    "bias",
    "qkv_bias",  # megatron writes --add-qkv-bias and reads it back, plain deepspeed names it in
    # a comment; megatron-deepspeed and torchtitan refuse it (test_qkv_bias_export.py)
    "qk_norm",  # megatron writes --qk-layernorm and reads it back, torchtitan's qwen3 flavors
    # build it (its llama3 refuses it), megatron-deepspeed refuses it, plain deepspeed names it
    # in a comment (test_norms_export.py)
    "norm_eps",  # megatron writes --norm-epsilon, megatron-deepspeed --layernorm-epsilon (both
    # read back), torchtitan a defined flavor's or says the one its flavor trains at, plain
    # deepspeed names it in a comment (test_norms_export.py)
    "tie_embeddings",
    "dropout",
    "head_dim",
    "moe",  # megatron writes it; torchtitan its qwen3/deepseek_v3 flavors (test_torchtitan_moe.py);
    # deepspeed refuses it (test_megatron_moe.py)
    "mla",
    "mtp_layers",  # megatron writes --mtp-num-layers, torchtitan >= 0.3 num_mtp_layers for
    # deepseek_v3 (test_torchtitan_moe.py); the others refuse it (test_export_mtp.py)
    "rope_theta",  # megatron writes --rotary-base, torchtitan its flavor's theta or refuses;
    # deepspeed names it in a comment (test_rope_theta.py)
    "rope_scaling",  # megatron writes --use-rope-scaling --rope-scaling-factor and reads them
    # back, deepspeed names it in a comment, torchtitan uses its (scaled) Llama 3 flavors only
    # for a model that scales as they do and writes it into a defined flavor's ComplexRoPE
    # (test_rope_scaling_export.py)
}


def test_every_plan_field_is_accounted_for():
    assert {f.name for f in dataclasses.fields(Plan)} == PLAN_FIELDS
    assert {f.name for f in dataclasses.fields(ModelSpec)} == MODEL_FIELDS
