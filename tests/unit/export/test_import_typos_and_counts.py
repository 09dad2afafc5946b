"""`autoplan import` refuses what the framework would refuse instead of reading on with defaults:
a misspelled DeepSpeed key or Megatron flag, an optimizer the cost model does not price, and a
--num-gpus other than the launch's; a refusal names the value, the fix and, for a misspelling,
the name meant."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from autoplan.export import megatron_import
from autoplan.export.deepspeed_keys import SECTION_KEYS
from autoplan.export.importers import import_deepspeed, import_megatron
from autoplan.export.megatron_args import LAUNCHER_FLAGS, READ_FLAGS, UNREAD_NEIGHBOURS
from tests.cli_refusals import assert_refused

CLUSTER = "a100-sxm4-80gb"
DS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
MEGATRON = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --vocab-size 50257 --micro-batch-size 1 "
            "--global-batch-size 64 --bf16 ")
"""gpt3-1.3b's shape and batch, as Megatron-LM arguments."""


def _ds_import(tmp_path: Path, capsys, cfg: dict, *needles: str) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return assert_refused(capsys, ["import", str(path), "--from", "deepspeed", "--model",
                                   "gpt3-1.3b", "--cluster", CLUSTER, "--num-gpus", "16"],
                          *needles)


def _ds(tmp_path: Path, cfg: dict):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return import_deepspeed(path, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=16)


def _megatron(tmp_path: Path, text: str, num_gpus: int | None = 16, model: str | None = None):
    path = tmp_path / "args.sh"
    path.write_text(text)
    return import_megatron(path, model=model, cluster=CLUSTER, num_gpus=num_gpus)


def _megatron_refused(tmp_path: Path, capsys, text: str, *needles: str,
                      extra: tuple[str, ...] = ("--num-gpus", "16")) -> str:
    path = tmp_path / "args.sh"
    path.write_text(text)
    return assert_refused(capsys, ["import", str(path), "--from", "megatron", "--cluster",
                                   CLUSTER, *extra], *needles)


def _mds_launch(tmp_path: Path, flags: str, json_extra: dict | None = None) -> tuple[Path, str]:
    """A Megatron-DeepSpeed launch of gpt3-1.3b's shape on 8 x 8 GPUs (tp 2, pp 2) with `flags`
    added, and its DeepSpeed JSON (ZeRO-1, bf16; `json_extra` added): the launch's path and
    text (not yet written)."""
    (tmp_path / "ds.json").write_text(json.dumps(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
         "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
         "bf16": {"enabled": True}, **(json_extra or {})}))
    text = ("deepspeed --num_nodes=8 --num_gpus=8 --master_port 29500 pretrain_gpt.py "
            "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
            "--micro-batch-size 2 --global-batch-size 64 --num-layers 24 --hidden-size 2048 "
            "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
            f"--vocab-size 50256 --bf16 --deepspeed --deepspeed_config ds.json {flags}\n")
    return tmp_path / "ds.launch.sh", text


# ---- 1. DeepSpeed keys and optimizer -----------------------------------------------------------


def test_the_reported_deepspeed_config_is_refused_at_its_first_misspelling(tmp_path, capsys):
    """It imported as ZeRO-0, fp32 and Adam with exit 0."""
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
           "zero_optimization": {"stgae": 3}, "bf16": {"enabeld": True},
           "optimizer": {"type": "SGD"}}
    _ds_import(tmp_path, capsys, cfg, "zero_optimization.stgae: not a DeepSpeed key",
               "did you mean 'stage'?")


@pytest.mark.parametrize(("section", "key", "meant"), [
    ("bf16", "enabeld", "enabled"),
    ("fp16", "enable", "enabled"),
    ("bfloat16", "enabeld", "enabled"),
    ("tensor_parallel", "autotp_sise", "autotp_size"),
])
def test_a_misspelled_key_in_a_section_deepspeed_checks_is_refused(tmp_path, capsys, section,
                                                                   key, meant):
    cfg = {k: v for k, v in DS.items() if k != "bf16"} | {section: {key: True}}
    _ds_import(tmp_path, capsys, cfg, f"{section}.{key}: not a DeepSpeed key",
               f"did you mean '{meant}'?")


@pytest.mark.parametrize("offload", ["offload_optimizer", "offload_param"])
def test_a_misspelled_offload_key_is_refused(tmp_path, capsys, offload):
    cfg = DS | {"zero_optimization": {"stage": 3, offload: {"devcie": "cpu"}}}
    _ds_import(tmp_path, capsys, cfg, f"zero_optimization.{offload}.devcie",
               "did you mean 'device'?")


def test_an_unknown_key_like_no_known_one_lists_the_valid_keys(tmp_path, capsys):
    cfg = DS | {"fp16": {"xyzzy": 1}, "bf16": {"enabled": False}}
    err = _ds_import(tmp_path, capsys, cfg, "fp16.xyzzy: not a DeepSpeed key", "expected one of")
    assert "loss_scale_window" in err and "enabled" in err


def test_valid_deepspeed_keys_the_importer_does_not_use_still_import(tmp_path):
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
           "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 5e8,
                                 "stage3_prefetch_bucket_size": 5e7, "sub_group_size": 1e9,
                                 "offload_param": {"device": "cpu", "pin_memory": True},
                                 "offload_optimizer": {"device": "cpu", "pin_memory": True}},
           "bf16": {"enabled": True, "immediate_grad_update": True},
           "fp16": {"enabled": False, "loss_scale_window": 1000, "hysteresis": 2},
           "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": False},
           # plain dicts to DeepSpeed: any key goes
           "activation_checkpointing": {"number_checkpoints": 4, "anything": 1},
           "pipeline": {"activation_checkpoint_interval": 0, "anything": 1}}
    plan = _ds(tmp_path, cfg)
    assert (plan.zero_stage, plan.offload.params, plan.offload.optimizer) == (3, True, True)
    assert plan.precision.value == "bf16" and plan.parallel.tp == 2


def test_the_key_lists_hold_every_key_the_installed_deepspeed_takes():
    """SECTION_KEYS must never refuse a key DeepSpeed's own config classes define."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    classes = {"zero_optimization": DeepSpeedZeroConfig, "bf16": DeepSpeedBF16Config,
               "bfloat16": DeepSpeedBF16Config, "fp16": DeepSpeedFP16Config,
               "tensor_parallel": TPTrainingConfig,
               "zero_optimization.offload_param": DeepSpeedZeroOffloadParamConfig,
               "zero_optimization.offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig}
    assert set(classes) == set(SECTION_KEYS)
    for section, cls in classes.items():
        assert cls.model_config.get("extra") == "forbid", section
        taken = {n for name, field in cls.model_fields.items() for n in (name, field.alias) if n}
        assert taken <= SECTION_KEYS[section], (section, taken - SECTION_KEYS[section])


def test_bf16_is_read_before_the_legacy_bfloat16_as_deepspeed_reads_them(tmp_path):
    """precision_config.get_bfloat16_config reads "bfloat16" only where "bf16" is absent."""
    base = {k: v for k, v in DS.items() if k != "bf16"}
    assert _ds(tmp_path, base | {"bf16": {"enabled": False},
                                 "bfloat16": {"enabled": True}}).precision.value == "fp32"
    assert _ds(tmp_path, base | {"bfloat16": {"enabled": True}}).precision.value == "bf16"


@pytest.mark.parametrize("kind", ["SGD", "Lamb", "OneBitAdam", "Lion", "Adagrad"])
def test_an_optimizer_the_cost_model_does_not_price_is_refused_as_megatrons_is(tmp_path, capsys,
                                                                               kind):
    err = _ds_import(tmp_path, capsys, DS | {"optimizer": {"type": kind}},
                     f"optimizer.type: got '{kind}'")
    megatron = _megatron_refused(tmp_path, capsys, MEGATRON + "--optimizer sgd",
                                 "--optimizer: got 'sgd'")
    assert err.split("; ", 1)[1] == megatron.split("; ", 1)[1]  # one wording, one helper


@pytest.mark.parametrize("kind", ["Adam", "AdamW", "adamw", "ADAM"])
def test_adam_and_adamw_import(tmp_path, kind):
    assert _ds(tmp_path, DS | {"optimizer": {"type": kind, "params": {"lr": 1e-4}}}).zero_stage == 3


def test_an_optimizer_type_that_is_not_a_name_is_refused(tmp_path, capsys):
    _ds_import(tmp_path, capsys, DS | {"optimizer": {"type": 1}}, "optimizer.type: got 1")


# ---- 2. Megatron flags ------------------------------------------------------------------------


@pytest.mark.parametrize(("typo", "meant"), [
    ("--tensor-model-paralel-size 4", "--tensor-model-parallel-size"),
    ("--bf-16", "--bf16"),
    ("--seq-len 2048", "--seq-length"),
    ("--tensor_model_parallel_size 4", "--tensor-model-parallel-size"),
    ("--num_layers_per_virtual_pipeline_stage 2", "--num-layers-per-virtual-pipeline-stage"),
    ("--use-distributed-optimiser", "--use-distributed-optimizer"),
    ("--recompute-granularty full", "--recompute-granularity"),
])
def test_a_misspelled_megatron_flag_is_refused_naming_the_flag_meant(tmp_path, capsys, typo,
                                                                     meant):
    """They imported as the flag's default (tp=1, fp32, ...); Megatron's argparse
    (allow_abbrev=False) refuses them."""
    name = typo.split()[0]
    _megatron_refused(tmp_path, capsys, MEGATRON + typo,
                      f"{name}: not a Megatron flag; did you mean {meant}?")


def test_the_reported_megatron_typos_no_longer_import_as_defaults(tmp_path):
    from autoplan.errors import ConfigError

    for typo in ("--tensor-model-paralel-size 4", "--bf-16"):
        with pytest.raises(ConfigError, match="not a Megatron flag"):
            _megatron(tmp_path, MEGATRON.replace("--bf16 ", "") + typo, model="gpt3-1.3b")


def test_flags_the_importer_skips_are_said_once_and_real_neighbours_import(tmp_path, caplog):
    """Megatron flags near one we read (--fp4-format, --encoder-tensor-model-parallel-size)
    and torchrun's are no misspellings; what is skipped is said in one warning."""
    text = ("torchrun --nnodes 2 --nproc_per_node 8 --rdzv-endpoint h:1 pretrain_gpt.py "
            + MEGATRON + "--tensor-model-parallel-size 2 --lr 3e-4 --fp4-format e2m1 "
            "--encoder-tensor-model-parallel-size 1 --virtual-pipeline-model-parallel-size 1")
    with caplog.at_level(logging.WARNING):
        plan = _megatron(tmp_path, text, num_gpus=None)
    assert (plan.parallel.tp, plan.parallel.dp, plan.precision.value) == (2, 8, "bf16")
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1, said
    # --max-position-embeddings is read (checked against --seq-length), not skipped
    assert said[0].endswith("skipped: --lr --fp4-format "
                            "--encoder-tensor-model-parallel-size "
                            "--virtual-pipeline-model-parallel-size"), said


def test_a_launch_of_read_flags_only_says_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        _megatron(tmp_path, MEGATRON)
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def _read_in_source(*modules: str) -> set[str]:
    source = "".join((Path(megatron_import.__file__).parent / f"{m}.py").read_text()
                     for m in modules)
    pattern = r"(?:\.(?:has|text|integer|number|need)|flag_values)\([^()\"]*\"(--[\w-]+)\""
    return set(re.findall(pattern, source))


def test_every_flag_the_importer_reads_is_in_read_flags():
    """READ_FLAGS is what misspellings are caught against: a flag read but not listed would
    let its misspelling through as its default."""
    read = _read_in_source("megatron_import", "megatron_args", "megatron_model",
                           "megatron_pipeline", "megatron_moe", "megatron_neutral")
    assert len(read) > 60
    assert read - READ_FLAGS - LAUNCHER_FLAGS == set()


def test_no_megatron_core_config_name_is_taken_for_a_misspelling():
    """Megatron's flags are mostly its config fields, dashed: none may be refused."""
    pytest.importorskip("megatron.core")
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    from autoplan.export.shell_args import near_miss

    names = {"--" + field.name.replace("_", "-")
             for cls in (TransformerConfig, MLATransformerConfig, ModelParallelConfig,
                         OptimizerConfig, DistributedDataParallelConfig)
             for field in dataclasses.fields(cls)}
    refused = {n: near_miss(n, READ_FLAGS) for n in names - READ_FLAGS - UNREAD_NEIGHBOURS}
    assert {n: m for n, m in refused.items() if m} == {}


# ---- 3. --num-gpus against the launch ---------------------------------------------------------


def test_num_gpus_other_than_the_megatron_launch_is_refused_naming_both(tmp_path, capsys):
    """8 nodes x 8 GPUs imported under --num-gpus 128 as dp=64 instead of 32."""
    text = ("torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py "
            + MEGATRON + "--tensor-model-parallel-size 2")
    _megatron_refused(tmp_path, capsys, text, "--num-gpus: 128, but", "launches 64 GPUs",
                      "--nnodes 8 x --nproc-per-node 8", "pass --num-gpus 64",
                      extra=("--model", "gpt3-1.3b", "--num-gpus", "128"))
    assert _megatron(tmp_path, text, num_gpus=64).parallel.dp == 32
    assert _megatron(tmp_path, text, num_gpus=None).parallel.dp == 32


def test_num_gpus_other_than_the_deepspeed_launch_names_that_conflict(tmp_path, capsys):
    """It was refused as 'the model is split 2 ways', never naming 128 against 64."""
    (tmp_path / "ds.json").write_text(json.dumps(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
         "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
         "bf16": {"enabled": True}}))
    launch = tmp_path / "ds.launch.sh"
    launch.write_text(
        "deepspeed --num_nodes=8 --num_gpus=8 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 64 "
        "--num-layers 24 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --tokenizer-type NullTokenizer "
        "--vocab-size 50256 --bf16 --deepspeed --zero-stage 1 --deepspeed_config ds.json\n")
    err = assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model",
                                  "gpt3-1.3b", "--cluster", CLUSTER, "--num-gpus", "128"],
                         "--num-gpus: 128, but", "launches 64 GPUs",
                         "--num_nodes 8 x --num_gpus 8")
    assert "split" not in err
    plan = import_deepspeed(launch, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=64)
    assert (plan.parallel.dp, plan.parallel.tp, plan.parallel.pp) == (16, 2, 2)


# ---- 4. the fix for a missing micro-batch size --------------------------------------------------


def test_a_missing_micro_batch_size_is_not_fixed_by_passing_model(tmp_path, capsys):
    text = MEGATRON.replace("--micro-batch-size 1 ", "")
    err = _megatron_refused(tmp_path, capsys, text, "no --micro-batch-size; add it",
                            extra=("--model", "gpt3-1.3b", "--num-gpus", "16"))
    assert "pass --model" not in err
    # a missing shape flag is still fixed by --model
    _megatron_refused(tmp_path, capsys, MEGATRON.replace("--hidden-size 2048 ", ""),
                      "no --hidden-size; add it, or pass --model")


def test_a_misspelled_flag_in_a_megatron_deepspeed_launch_is_refused(tmp_path, capsys):
    """pretrain_gpt.py's argparse refuses a flag it does not define; the import refused nothing
    and read --tensor-model-paralel-size as tp 1. A plain DeepSpeed launch's flags are the
    user's own script's and are not checked."""
    launch, good = _mds_launch(tmp_path, "--ffn-hidden-size 8192 --tokenizer-type "
                               "NullTokenizer --zero-stage 1")
    launch.write_text(good.replace("--tensor-model-parallel-size", "--tensor-model-paralel-size"))
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model",
                            "gpt3-1.3b", "--cluster", CLUSTER],
                   "--tensor-model-paralel-size: not a Megatron-DeepSpeed flag",
                   "did you mean --tensor-model-parallel-size?")
    launch.write_text(good)
    plan = import_deepspeed(launch, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=None)
    assert (plan.parallel.dp, plan.parallel.tp, plan.parallel.pp) == (16, 2, 2)
    (tmp_path / "plain.json").write_text(json.dumps(
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
         "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}))
    plain = tmp_path / "plain.launch.sh"  # the user's script: its flags are its own
    plain.write_text("deepspeed --num_nodes=1 --num_gpus=8 train.py --tensor-paralel 2 "
                     "--deepspeed --deepspeed_config plain.json\n")
    assert import_deepspeed(plain, model="gpt3-1.3b", cluster=CLUSTER,
                            num_gpus=None).parallel.dp == 8


def test_a_megatron_deepspeed_launch_with_sgd_is_refused_whatever_its_json_says(tmp_path, capsys):
    """Megatron-DeepSpeed builds its optimizer from --optimizer and hands it to
    deepspeed.initialize, whose engine runs that client optimizer rather than the JSON's
    section: `--optimizer sgd` beside a JSON naming Adam runs SGD."""
    launch, text = _mds_launch(tmp_path, "--optimizer OPT", {"optimizer": {"type": "Adam"}})
    launch.write_text(text.replace("OPT", "sgd"))
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model",
                            "gpt3-1.3b", "--cluster", CLUSTER],
                   "--optimizer: got 'sgd'", "import an Adam run")
    launch.write_text(text.replace("OPT", "adam"))
    assert import_deepspeed(launch, model="gpt3-1.3b", cluster=CLUSTER,
                            num_gpus=None).parallel.tp == 2
    # and the other way round: --optimizer adam over a JSON naming SGD runs Adam
    cfg = json.loads((tmp_path / "ds.json").read_text())
    (tmp_path / "ds.json").write_text(json.dumps({**cfg, "optimizer": {"type": "SGD"}}))
    assert import_deepspeed(launch, model="gpt3-1.3b", cluster=CLUSTER,
                            num_gpus=None).parallel.tp == 2


def test_a_file_with_no_megatron_flags_is_named_as_such(tmp_path, capsys):
    """A DeepSpeed JSON or any text imported --from megatron was answered "--num-gpus: missing",
    then "no --micro-batch-size", never that it is not a Megatron launch."""
    for name, text, fix in (("ds.json", json.dumps(DS), "imports with --from deepspeed"),
                            ("notes.txt", "hello world\n", "launch script or arguments file")):
        path = tmp_path / name
        path.write_text(text)
        assert_refused(capsys, ["import", str(path), "--from", "megatron", "--cluster", CLUSTER,
                                "--num-gpus", "16"], "holds no Megatron flags", fix)


def test_import_set_refuses_a_field_given_two_values_as_estimate_does(tmp_path, capsys):
    """`import --set` applied its edits last-one-wins while `estimate --set` refuses a field set
    twice to different values; both now apply them alike."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS))
    assert_refused(capsys, ["import", str(path), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER, "--num-gpus", "16", "--set", "zero_stage=1",
                            "--set", "zero_stage=2"], "zero_stage", "given twice")
    plan = import_deepspeed(path, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=16,
                            assignments=["zero_stage=1", "zero_stage=1"])
    assert plan.zero_stage == 1
