"""Importers refuse what they cannot read exactly, never coerce it (issue #14 items 9 and 17).

Each case goes through the real `autoplan import` entry point: one line naming the key or flag,
the value and the valid choices, exit code 2, nothing on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.commands import main

DS_BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
           "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1},
           "bf16": {"enabled": True}}
MEGATRON_BASE = [
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "64", "--max-position-embeddings", "64", "--vocab-size", "256",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16",
]


def _import(tmp_path: Path, capsys, source: str, text: str) -> tuple[int, str, str]:
    path = tmp_path / ("ds.json" if source == "deepspeed" else "args.txt")
    path.write_text(text)
    argv = ["import", str(path), "--from", source, "--cluster", "cpu-gloo", "--num-gpus", "2"]
    if source == "deepspeed":
        argv += ["--model", "tiny"]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2 and out == "" and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


def test_the_bases_import(tmp_path, capsys) -> None:
    code, out, _ = _import(tmp_path, capsys, "deepspeed", json.dumps(DS_BASE))
    assert code == 0 and "zero_stage: 1" in out and "precision: bf16" in out
    code, out, _ = _import(tmp_path, capsys, "megatron", " ".join(MEGATRON_BASE))
    assert code == 0 and "pp: 2" in out


@pytest.mark.parametrize("stage", [None, "auto", "abc", 2.9, True, 4, -1, [1]])
def test_deepspeed_stage_must_be_0_to_3(tmp_path, capsys, stage) -> None:
    cfg = {**DS_BASE, "zero_optimization": {"stage": stage}}
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)),
             "zero_optimization.stage", "0, 1, 2, 3")


@pytest.mark.parametrize("key", ["zero_optimization", "bf16", "fp16", "pipeline",
                                 "tensor_parallel", "activation_checkpointing"])
def test_deepspeed_sections_given_as_lists_are_refused(tmp_path, capsys, key) -> None:
    cfg = {**DS_BASE, key: [{"enabled": True}]}
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), key, "JSON object")


def test_deepspeed_offload_section_as_a_list_is_refused(tmp_path, capsys) -> None:
    cfg = {**DS_BASE, "zero_optimization": {"stage": 2, "offload_optimizer": ["cpu"]}}
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), "offload_optimizer")


@pytest.mark.parametrize("flag", [[True], "true", 1, None])
def test_deepspeed_enabled_must_be_a_boolean(tmp_path, capsys, flag) -> None:
    cfg = {**DS_BASE, "bf16": {"enabled": flag}}
    if flag is None:  # null is not a boolean either
        _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), "bf16.enabled")
        return
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), "bf16.enabled",
             "true or false")


def test_deepspeed_bf16_as_a_list_is_not_fp32(tmp_path, capsys) -> None:
    cfg = {**DS_BASE, "bf16": [True]}
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), "bf16")


def test_deepspeed_fp16_and_bf16_both_on_is_refused(tmp_path, capsys) -> None:
    cfg = {**DS_BASE, "fp16": {"enabled": True}}
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), "fp16", "bf16")


@pytest.mark.parametrize(("section", "key", "value", "words"), [
    ("activation_checkpointing", "cpu_checkpointing", True, ("host memory", "set it false")),
    ("activation_checkpointing", "cpu_checkpointing", "yes", ("true or false",)),
    ("activation_checkpointing", "partition_activations", 1, ("true or false",)),
    ("zero_optimization", "mics_shard_size", 1, ("MiCS", "sub-groups of 1 of the 2", "set -1")),
    ("zero_optimization", "mics_shard_size", 2.5, ("whole number",)),
])
def test_deepspeed_settings_a_plan_cannot_say_are_refused(tmp_path, capsys, section, key,
                                                          value, words) -> None:
    cfg = json.loads(json.dumps(DS_BASE))
    cfg.setdefault(section, {})[key] = value
    if section == "zero_optimization":
        cfg[section]["stage"] = 3
    _refused(*_import(tmp_path, capsys, "deepspeed", json.dumps(cfg)), f"{section}.{key}",
             *words)


@pytest.mark.parametrize(("stage", "mics"), [(3, -1), (3, 2), (3, 8), (2, 1)])
def test_deepspeed_plain_settings_still_import(tmp_path, capsys, stage, mics) -> None:
    """MiCS off (-1), over every dp rank (plain ZeRO-3), or below stage 3 (where DeepSpeed
    ignores it); checkpoints on the GPU, partitioned at tp 1 (a no-op): nothing said."""
    cfg = {**DS_BASE, "zero_optimization": {"stage": stage, "mics_shard_size": mics},
           "activation_checkpointing": {"partition_activations": True,
                                        "cpu_checkpointing": False}}
    code, out, err = _import(tmp_path, capsys, "deepspeed", json.dumps(cfg))
    assert code == 0 and f"zero_stage: {stage}" in out and "policy: full" in out and err == ""


def test_partitioned_activations_under_tp_are_said_to_be_priced_whole(caplog) -> None:
    import logging

    from autoplan.export.deepspeed_import import deepspeed_plan_dict

    cfg = {**DS_BASE, "activation_checkpointing": {"partition_activations": True}}
    with caplog.at_level(logging.WARNING):
        data = deepspeed_plan_dict(cfg, 4, "ds.json", {"tp": 2})
    assert data["recompute"] == {"policy": "full"} and data["parallel"]["tp"] == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "partition_activations" in said[0] and "2 tensor" in said[0]


def test_deepspeed_nan_is_not_json(tmp_path, capsys) -> None:
    text = json.dumps(DS_BASE).replace('"stage": 1', '"stage": NaN')
    _refused(*_import(tmp_path, capsys, "deepspeed", text), "NaN")


@pytest.mark.parametrize(
    "flag, value, choices",
    [
        ("--recompute-granularity", "bogus", "full, selective"),
        ("--recompute-method", "bogus", "uniform, block"),
        ("--attention-backend", "bogus", "flash"),
        ("--normalization", "Bogus", "LayerNorm, RMSNorm"),
    ],
)
def test_megatron_choices_are_refused_not_defaulted(tmp_path, capsys, flag, value,
                                                     choices) -> None:
    extra = ["--recompute-granularity", "full"] if flag == "--recompute-method" else []
    text = " ".join([*MEGATRON_BASE, *extra, flag, value])
    _refused(*_import(tmp_path, capsys, "megatron", text), flag, value, choices)


@pytest.mark.parametrize("backend, attention", [("fused", "flash"), ("unfused", "eager"),
                                                ("local", "eager"), ("auto", "flash")])
def test_megatron_attention_backends_map_exactly(tmp_path, capsys, backend, attention) -> None:
    code, out, _ = _import(tmp_path, capsys, "megatron",
                           " ".join([*MEGATRON_BASE, "--attention-backend", backend]))
    assert code == 0 and f"attention: {attention}" in out


@pytest.mark.parametrize("layout", ["t*999999999999", "(t)*999999999999", "((t*9)*999)*999",
                                    "E" + "t*99999" + "|tL"])
def test_megatron_layout_is_bounded_before_expanding(tmp_path, capsys, layout) -> None:
    text = " ".join([*MEGATRON_BASE, "--pipeline-model-parallel-layout", f"'{layout}'"])
    _refused(*_import(tmp_path, capsys, "megatron", text), "layout", "expands past")


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--context-parallel-size"])
@pytest.mark.parametrize("value", ["0", "-2", "1_0", "٣"])
def test_megatron_degrees_are_positive_ascii_integers(tmp_path, capsys, flag, value) -> None:
    text = " ".join([*MEGATRON_BASE, flag, value])
    _refused(*_import(tmp_path, capsys, "megatron", text), flag)


def test_megatron_nan_dropout_is_refused(tmp_path, capsys) -> None:
    text = " ".join([*MEGATRON_BASE, "--attention-dropout", "nan", "--hidden-dropout", "nan"])
    _refused(*_import(tmp_path, capsys, "megatron", text), "dropout")


def test_megatron_kv_channels_is_the_head_dim(tmp_path, capsys) -> None:
    text = " ".join([*MEGATRON_BASE, "--kv-channels", "32"])  # 4 heads of 32 on h = 64
    code, out, _ = _import(tmp_path, capsys, "megatron", text)
    assert code == 0 and "head_dim: 32" in out


def test_geglu_and_set_apart_heads_export_to_megatron_or_refuse() -> None:
    from autoplan.errors import ConfigError
    from autoplan.export.base import ExportOptions, export_plan
    from autoplan.export.registry import get_target
    from autoplan.model_spec import PRESETS, MlpKind
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan

    def plan(zero: int = 1, **model_changes):
        model = PRESETS["llama-3-8b"].replace(**model_changes)
        return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", 8), batch=Batch(1, 8),
                    parallel=Parallel(dp=8), zero_stage=zero)

    def export(target: str, p: Plan) -> dict[str, str]:
        return export_plan(get_target(target), p, p.model_spec(), ExportOptions())

    assert export("torchtitan", plan(3))  # the 8B flavor: each refusal below is the field's
    assert "--kv-channels 256" in "".join(export("megatron", plan(head_dim=256)).values())
    for target, zero in (("megatron", 1), ("torchtitan", 3)):
        with pytest.raises(ConfigError):
            export(target, plan(zero, mlp=MlpKind.GEGLU))
    with pytest.raises(ConfigError):
        export("torchtitan", plan(3, head_dim=256))


def test_set_degrees_that_break_the_gpu_count_are_refused(tmp_path, capsys) -> None:
    """The rules were once given a cluster of the plan's own world size, so --set tp=2 (dp 1 *
    tp 2 * pp 2 = 4 on 2 GPUs) was written with exit 0."""
    text = " ".join(MEGATRON_BASE)
    path = tmp_path / "args.txt"
    path.write_text(text)
    code = main(["import", str(path), "--from", "megatron", "--cluster", "cpu-gloo",
                 "--num-gpus", "2", "--set", "parallel.tp=2"])
    _refused(code, *capsys.readouterr(), "dp * tp * pp * cp = 4 but the cluster has 2 GPUs")
