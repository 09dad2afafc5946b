"""Importing autoplan's own exports gives the plan back and says nothing: every flag the
Megatron and Megatron-DeepSpeed exporters write is read (or knowingly accepted), over a table
of plans at every ZeRO stage and tp/pp/cp/sp mix; what a plan cannot represent still warns."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_deepspeed, import_megatron
from autoplan.export.registry import get_target
from autoplan.plan import (
    Attention,
    Batch,
    Offload,
    Parallel,
    Pipeline,
    Precision,
    Recompute,
    RecomputeMethod,
    RecomputePolicy,
    ReduceDtype,
    Schedule,
)

from .cases import plan

FULL = Recompute(RecomputePolicy.FULL)
MEGATRON = {
    "gpt3-zero0-dp": plan("gpt3-1.3b", 16, zero_stage=0),
    "llama-zero0-tp-sp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2),
                              sequence_parallel=True, zero_stage=0),
    "llama-zero1-tp-no-sp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2), zero_stage=1),
    "llama-zero1-pp-vpp": plan("llama-3-8b", 16, parallel=Parallel(dp=4, pp=4), zero_stage=1,
                               pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, 2)),
    "llama-zero1-cp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, cp=2), zero_stage=1),
    "gpt3-zero1-tp-pp-cp-sp": plan("gpt3-1.3b", 16, parallel=Parallel(dp=2, tp=2, pp=2, cp=2),
                                   sequence_parallel=True, zero_stage=1, recompute=FULL),
    "llama-zero1-hsdp-offload": plan("llama-3-8b", 16, parallel=Parallel(dp=16, dp_shard=8),
                                     zero_stage=1, offload=Offload(optimizer=True)),
    "llama-zero2-dp": plan("llama-3-8b", 16, zero_stage=2),
    "llama-zero2-tp-cp-sp": plan("llama-3-8b", 16, parallel=Parallel(dp=4, tp=2, cp=2),
                                 sequence_parallel=True, zero_stage=2,
                                 grad_reduce_dtype=ReduceDtype.BF16),
    "gpt3-zero3-dp": plan("gpt3-1.3b", 16, zero_stage=3, recompute=FULL),
    "llama-zero3-tp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2), zero_stage=3,
                           recompute=Recompute(RecomputePolicy.FULL, 2, RecomputeMethod.UNIFORM)),
    "llama-fp8": plan("llama-3-8b", 16, zero_stage=1, precision=Precision.FP8),
    "gpt3-fp16-eager": plan("gpt3-1.3b", 16, parallel=Parallel(dp=8, tp=2), zero_stage=1,
                            precision=Precision.FP16, attention=Attention.EAGER),
    "mixtral-ep": plan("mixtral-8x7b", 64, parallel=Parallel(dp=16, tp=2, pp=2, ep=8),
                       sequence_parallel=True, zero_stage=1),
    "deepseek-v3-mla-mtp": plan("deepseek-v3", 64, parallel=Parallel(dp=64, ep=64),
                                zero_stage=1, batch=Batch(1, 512)),
}
"""Megatron-LM exports, ZeRO 0 to 3 (2/3: Megatron-FSDP, pp 1) with tp, pp, cp and sp mixed."""
MEGATRON_DEEPSPEED = {
    "zero0-dp": plan("gpt3-1.3b", 16, zero_stage=0),
    "zero1-dp-full": plan("gpt3-1.3b", 16, zero_stage=1, recompute=FULL),
    "zero2-dp": plan("llama-3-8b", 16, zero_stage=2),
    "zero3-dp-offload": plan("llama-3-8b", 16, zero_stage=3,
                             offload=Offload(optimizer=True, params=True)),
    "zero1-tp-sp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2),
                        sequence_parallel=True, zero_stage=1),
    "zero1-tp-pp-full": plan("gpt3-1.3b", 16, parallel=Parallel(dp=4, tp=2, pp=2),
                             zero_stage=1, recompute=FULL),
    "zero0-pp-fp16": plan("gpt3-1.3b", 16, parallel=Parallel(dp=4, pp=4), zero_stage=0,
                          precision=Precision.FP16),
    "zero3-tp": plan("llama-3-8b", 16, parallel=Parallel(dp=8, tp=2), sequence_parallel=True,
                     zero_stage=3),
}
"""DeepSpeed exports: plain ZeRO launches (tp = pp = 1) and Megatron-DeepSpeed's 3D ones."""


def _write(tmp_path: Path, target: str, p) -> dict[str, Path]:
    files = export_plan(get_target(target), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / name
        out[name].write_text(text)
    return out


@pytest.mark.parametrize("case", MEGATRON)
def test_megatron_export_imports_back_equal_and_silent(tmp_path, caplog, case):
    p = MEGATRON[case]
    path = _write(tmp_path, "megatron", p)["megatron_args.sh"]
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert [r.getMessage() for r in caplog.records] == []
    assert back == p


@pytest.mark.parametrize("case", MEGATRON_DEEPSPEED)
def test_deepspeed_launch_imports_back_equal_and_silent(tmp_path, caplog, case):
    p = MEGATRON_DEEPSPEED[case]
    launch = _write(tmp_path, "deepspeed", p)["launch.sh"]
    with caplog.at_level(logging.WARNING):
        back = import_deepspeed(launch, model=p.model, cluster=p.cluster.profile, num_gpus=None)
    assert [r.getMessage() for r in caplog.records] == []
    assert back == p


def test_the_table_covers_every_zero_stage_and_each_degree():
    for table in (MEGATRON, MEGATRON_DEEPSPEED):
        plans = list(table.values())
        assert {p.zero_stage for p in plans} == {0, 1, 2, 3}
        assert any(p.parallel.tp > 1 for p in plans) and any(p.parallel.pp > 1 for p in plans)
        assert any(p.sequence_parallel for p in plans)
    assert any(p.parallel.cp > 1 for p in MEGATRON.values())


# ---- flags the exporters write that decide no plan field ---------------------------------------


def _megatron_text(tmp_path: Path, case: str, edit) -> Path:
    p = MEGATRON[case]
    path = _write(tmp_path, "megatron", p)["megatron_args.sh"]
    path.write_text(edit(path.read_text()))
    return path


def test_max_position_embeddings_below_seq_length_is_refused_as_megatron_refuses_it(tmp_path):
    path = _megatron_text(tmp_path, "llama-zero1-cp", lambda t: t.replace(
        "--max-position-embeddings 8192", "--max-position-embeddings 4096"))
    with pytest.raises(ConfigError, match="--max-position-embeddings: 4096 is below "
                                          "--seq-length 8192; give at least 8192"):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)


def test_a_longer_learned_position_table_is_said_and_a_longer_rope_maximum_is_not(
        tmp_path, caplog):
    learned = _megatron_text(tmp_path, "gpt3-zero0-dp", lambda t: t.replace(
        "--max-position-embeddings 2048", "--max-position-embeddings 4096"))
    with caplog.at_level(logging.WARNING):
        back = import_megatron(learned, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back == MEGATRON["gpt3-zero0-dp"]
    [said] = [r.getMessage() for r in caplog.records]
    # gpt3-1.3b: hidden 2048, so 2048 more rows hold 4,194,304 parameters more than priced
    assert "4096 learned positions, priced as the --seq-length 2048" in said
    assert "4,194,304 parameters more than priced" in said
    caplog.clear()
    (tmp_path / "rope").mkdir()
    rope = _megatron_text(tmp_path / "rope", "llama-zero1-cp", lambda t: t.replace(
        "--max-position-embeddings 8192", "--max-position-embeddings 131072"))
    with caplog.at_level(logging.WARNING):
        import_megatron(rope, model="llama-3-8b", cluster="h100-sxm-80gb", num_gpus=None)
    assert caplog.records == []  # RoPE builds no table: nothing priced changes


def test_unfused_gradient_accumulation_without_megatron_fsdp_is_still_skipped(tmp_path, caplog):
    """Megatron-FSDP requires --no-gradient-accumulation-fusion (read there); in a ZeRO-1 run it
    unfuses what the megatron runtime prices fused, which a plan cannot say."""
    path = _megatron_text(tmp_path, "llama-zero1-cp", lambda t: t.replace(
        "--overlap-grad-reduce", "--overlap-grad-reduce --no-gradient-accumulation-fusion "
        "--ckpt-format torch_dist"))
    with caplog.at_level(logging.WARNING):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].endswith("skipped: --no-gradient-accumulation-fusion")


def test_the_megatron_deepspeed_launch_checks_its_positions_too(tmp_path):
    p = MEGATRON_DEEPSPEED["zero1-tp-sp"]
    files = _write(tmp_path, "deepspeed", p)
    launch = files["launch.sh"]
    launch.write_text(launch.read_text().replace("--max-position-embeddings 8192",
                                                 "--max-position-embeddings 2048"))
    with pytest.raises(ConfigError, match="2048 is below --seq-length 8192"):
        import_deepspeed(launch, model=p.model, cluster=p.cluster.profile, num_gpus=None)
