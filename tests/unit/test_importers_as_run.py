"""Importers read a config as the framework runs it: Megatron's uneven first/last stages under
virtual stages, its legacy rotary switch and its local transformer implementation; DeepSpeed's
legacy offload switches; and they refuse what a plan cannot say (ZeRO++, partial offload)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.export.importers import import_deepspeed, import_megatron
from autoplan.model_spec import PositionKind
from tests.cli_refusals import assert_refused

MEGATRON = [  # 32 layers on tp 2 x pp 4 of 16 GPUs (dp 2)
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
    "--num-layers", "32", "--hidden-size", "256", "--num-attention-heads", "4",
    "--seq-length", "256", "--max-position-embeddings", "256", "--vocab-size", "256",
    "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16",
]


def _megatron_file(tmp_path: Path, *extra: str) -> Path:
    path = tmp_path / "args.txt"
    path.write_text(" ".join([*MEGATRON, *extra]))
    return path


def _megatron(tmp_path: Path, *extra: str):
    return import_megatron(_megatron_file(tmp_path, *extra), model=None,
                           cluster="h100-sxm-80gb", num_gpus=16)


def _megatron_refused(tmp_path: Path, capsys, extra: list[str], *needles: str) -> None:
    path = _megatron_file(tmp_path, *extra)
    assert_refused(capsys, ["import", str(path), "--from", "megatron", "--cluster",
                            "h100-sxm-80gb", "--num-gpus", "16"], *needles)


@pytest.mark.parametrize("extra, split", [
    # Megatron-Core's get_num_layers_to_build: 6 layers on the first and last rank, (32 - 12) / 2
    # on each between, every rank's count split over its 2 virtual stages (model order)
    (["--decoder-first-pipeline-num-layers", "6", "--decoder-last-pipeline-num-layers", "6"],
     [3, 5, 5, 3, 3, 5, 5, 3]),
    (["--decoder-first-pipeline-num-layers", "2"], [1, 5, 5, 5, 1, 5, 5, 5]),
    (["--decoder-last-pipeline-num-layers", "8"], [4, 4, 4, 4, 4, 4, 4, 4]),
])
def test_uneven_ends_split_over_virtual_stages(tmp_path: Path, extra: list[str],
                                               split: list[int]) -> None:
    plan = _megatron(tmp_path, "--num-virtual-stages-per-pipeline-rank", "2", *extra)
    assert plan.pipeline.vpp == 2 and list(plan.pipeline.layers_per_stage or ()) == split


def test_uneven_first_alone_leaves_the_rest_to_the_other_ranks(tmp_path: Path) -> None:
    """Only --decoder-first-pipeline-num-layers: the other pp - 1 ranks share the rest."""
    plan = _megatron(tmp_path, "--decoder-first-pipeline-num-layers", "5")
    assert plan.pipeline.vpp == 1 and plan.pipeline.layers_per_stage == (5, 9, 9, 9)


@pytest.mark.parametrize("extra, needles", [
    (["--num-virtual-stages-per-pipeline-rank", "2", "--decoder-first-pipeline-num-layers", "5",
      "--decoder-last-pipeline-num-layers", "5"], ("decoder-first", "first 5, last 5", "multiple of vpp=2")),
    (["--decoder-first-pipeline-num-layers", "4"], ("decoder-first", "first 4, last unset", "evenly")),
    (["--num-layers-per-virtual-pipeline-stage", "2", "--decoder-first-pipeline-num-layers", "4",
      "--decoder-last-pipeline-num-layers", "4"],
     ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank")),
])
def test_uneven_ends_megatron_cannot_build_are_refused(tmp_path: Path, capsys, extra: list[str],
                                                      needles: tuple[str, ...]) -> None:
    _megatron_refused(tmp_path, capsys, extra, *needles)


def test_legacy_rotary_switch_is_rope(tmp_path: Path) -> None:
    """validate_args: --use-rotary-position-embeddings sets position_embedding_type = 'rope'."""
    args = [a for a in MEGATRON if a not in ("--position-embedding-type", "rope")]
    path = tmp_path / "args.txt"
    path.write_text(" ".join([*args, "--use-rotary-position-embeddings"]))
    plan = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=16)
    assert plan.model_spec().position == PositionKind.ROPE


@pytest.mark.parametrize("backend", [[], ["--attention-backend", "auto"],
                                     ["--attention-backend", "flash"]])
def test_local_transformer_impl_attends_unfused(tmp_path: Path, backend: list[str]) -> None:
    """The local spec builds Megatron-Core's DotProductAttention (full s x s scores) whatever
    --attention-backend says."""
    assert _megatron(tmp_path, "--transformer-impl", "local", *backend).attention.value == \
        "eager"
    assert _megatron(tmp_path, *backend).attention.value == "flash"


def test_unknown_transformer_impl_is_refused(tmp_path: Path, capsys) -> None:
    _megatron_refused(tmp_path, capsys, ["--transformer-impl", "te"], "--transformer-impl",
                      "'te'", "local, transformer_engine")


DEEPSPEED = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": 8, "bf16": {"enabled": True}}


def _deepspeed_file(tmp_path: Path, zero: dict) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**DEEPSPEED, "zero_optimization": zero}))
    return path


def _deepspeed(tmp_path: Path, zero: dict):
    return import_deepspeed(_deepspeed_file(tmp_path, zero), model="llama-3-8b",
                            cluster="h100-sxm-80gb", num_gpus=8)


def _deepspeed_refused(tmp_path: Path, capsys, zero: dict, *needles: str) -> None:
    path = _deepspeed_file(tmp_path, zero)
    assert_refused(capsys, ["import", str(path), "--from", "deepspeed", "--model", "llama-3-8b",
                            "--cluster", "h100-sxm-80gb", "--num-gpus", "8"], *needles)


@pytest.mark.parametrize("legacy, optimizer, params", [
    ({"cpu_offload": True, "cpu_offload_param": True}, True, True),
    ({"cpu_offload": True}, True, False),
    ({"cpu_offload": False, "cpu_offload_param": False}, False, False),
])
def test_legacy_offload_switches_offload_to_cpu(tmp_path: Path, legacy: dict, optimizer: bool,
                                                params: bool) -> None:
    """DeepSpeed maps cpu_offload / cpu_offload_param true to offload_optimizer / offload_param
    with device cpu (runtime/zero/config.py)."""
    plan = _deepspeed(tmp_path, {"stage": 3, **legacy})
    assert (plan.offload.optimizer, plan.offload.params) == (optimizer, params)


@pytest.mark.parametrize("zero, needles", [
    ({"cpu_offload": True, "offload_optimizer": {"device": "cpu"}},
     ("zero_optimization.cpu_offload", "offload_optimizer", "refuses both")),
    ({"cpu_offload_param": "yes"}, ("zero_optimization.cpu_offload_param", "'yes'",
                                    "true or false")),
    ({"zero_hpz_partition_size": 8}, ("zero_hpz_partition_size", "got 8", "ZeRO++", "set 1")),
    ({"zero_quantized_weights": True}, ("zero_quantized_weights", "got true", "ZeRO++")),
    ({"zero_quantized_gradients": True}, ("zero_quantized_gradients", "got true", "ZeRO++")),
    ({"offload_optimizer": {"device": "cpu", "ratio": 0.3}},
     ("offload_optimizer.ratio", "got 0.3", "ratio 1.0")),
])
def test_what_a_plan_cannot_say_is_refused(tmp_path: Path, capsys, zero: dict,
                                          needles: tuple[str, ...]) -> None:
    _deepspeed_refused(tmp_path, capsys, {"stage": 3, **zero}, *needles)


def test_plain_zero_values_of_the_zero_plus_plus_keys_import(tmp_path: Path) -> None:
    plan = _deepspeed(tmp_path, {"stage": 3, "zero_hpz_partition_size": 1,
                                 "zero_quantized_weights": False,
                                 "offload_optimizer": {"device": "cpu", "ratio": 1.0}})
    assert plan.zero_stage == 3 and plan.offload.optimizer
