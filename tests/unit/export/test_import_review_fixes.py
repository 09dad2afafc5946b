"""`autoplan import` reads a launch as Megatron and Megatron-DeepSpeed run it: --model must be the
model the shape flags build, recompute follows the launch's flags, the degrees are checked, and
--out is never a file the import reads."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from autoplan.export.importers import import_deepspeed, import_megatron
from autoplan.plan import RecomputeMethod, RecomputePolicy
from tests.cli_refusals import assert_refused

CLUSTER = "a100-sxm4-80gb"
GPT3_1_3B = ("--num-layers 24 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 16 "
             "--seq-length 2048 --max-position-embeddings 2048 --tokenizer-type NullTokenizer "
             "--vocab-size 50256 --bf16")
"""gpt3-1.3b's shape as `export --to deepspeed` writes it (NullTokenizer adds the 50257th)."""
LLAMA_3_8B = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 8192 "
              "--micro-batch-size 1 --global-batch-size 64 --bf16 --swiglu")


def _launch(tmp_path: Path, flags: str, *, tp: int = 2, pp: int = 2, cfg: dict | None = None,
            shape: str = GPT3_1_3B) -> Path:
    """A Megatron-DeepSpeed launch of 16 GPUs and the DeepSpeed JSON it names, beside it."""
    dp = 16 // (tp * pp)
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
              "gradient_accumulation_steps": 64 // (2 * dp), "zero_optimization": {"stage": 1},
              "bf16": {"enabled": True}, **(cfg or {})}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    path = tmp_path / "ds.launch.sh"
    path.write_text(
        f"deepspeed --num_nodes=2 --num_gpus=8 pretrain_gpt.py --tensor-model-parallel-size {tp} "
        f"--pipeline-model-parallel-size {pp} --micro-batch-size 2 --global-batch-size 64 "
        f"{shape} {flags} --deepspeed --zero-stage 1 --deepspeed_config ds.json\n")
    return path


def _ds(path: Path, model: str = "gpt3-1.3b"):
    return import_deepspeed(path, model=model, cluster=CLUSTER, num_gpus=None)


def _args(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "args.txt"
    path.write_text(text)
    return path


def _megatron(path: Path, model: str | None = None):
    return import_megatron(path, model=model, cluster=CLUSTER, num_gpus=8)


# ---- 1. --model against the shape flags ------------------------------------------------------


def test_a_deepspeed_launch_of_another_model_than_model_is_refused(tmp_path, capsys):
    """The launch's 24 layers of 2048 were imported as llama-3-8b and priced as that."""
    launch = _launch(tmp_path, "--checkpoint-activations")
    assert _ds(launch).model == "gpt3-1.3b"
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "llama-3-8b",
                            "--cluster", CLUSTER], "--num-layers: 24 but --model llama-3-8b has 32")


@pytest.mark.parametrize(("change", "needle"), [
    (("--ffn-hidden-size 8192", "--ffn-hidden-size 4096"), "--ffn-hidden-size: 4096"),
    (("--vocab-size 50256", "--vocab-size 32000"), "--vocab-size: 32001 pads to 32256 rows"),
    (("--bf16", "--bf16 --num-key-value-heads 4"), "--num-key-value-heads: 4 key/value heads"),
])
def test_a_deepspeed_launch_differing_in_ffn_vocab_or_kv_heads_is_refused(tmp_path, capsys,
                                                                           change, needle):
    launch = _launch(tmp_path, "", shape=GPT3_1_3B.replace(*change))
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER], needle, "but --model gpt3-1.3b")


@pytest.mark.parametrize(("flags", "needle"), [
    ("--ffn-hidden-size 11008 --vocab-size 32000", "--ffn-hidden-size: 11008 but"),
    ("--ffn-hidden-size 14336 --vocab-size 32000 --group-query-attention --num-query-groups 8",
     "--vocab-size: 32000 pads to 32000 rows at tp=1 but --model llama-3-8b's 128256 pads to "
     "128256"),
    ("--ffn-hidden-size 14336 --vocab-size 128256",
     "--group-query-attention: 32 key/value heads but --model llama-3-8b has 8"),
    ("--ffn-hidden-size 14336 --vocab-size 128256 --group-query-attention --num-query-groups 4",
     "--num-query-groups: 4 key/value heads"),
    ("--vocab-size 128256 --group-query-attention --num-query-groups 8",  # swiglu default: 10880
     "--ffn-hidden-size: 10880 but"),
])
def test_megatron_arguments_that_build_another_model_than_model_are_refused(tmp_path, capsys,
                                                                             flags, needle):
    """`--ffn-hidden-size 11008 --vocab-size 32000` without GQA imported as llama-3-8b."""
    args = _args(tmp_path, f"{LLAMA_3_8B} {flags}")
    assert_refused(capsys, ["import", str(args), "--from", "megatron", "--model", "llama-3-8b",
                            "--cluster", CLUSTER, "--num-gpus", "8"], needle)


@pytest.mark.parametrize("vocab", [128256, 128200])
def test_megatron_arguments_of_the_model_import_under_model(tmp_path, vocab):
    """A vocabulary Megatron pads to the model's rows (128200 -> 128256) builds the same
    embedding the plan prices."""
    args = _args(tmp_path, f"{LLAMA_3_8B} --ffn-hidden-size 14336 --vocab-size {vocab} "
                           "--group-query-attention --num-query-groups 8")
    assert _megatron(args, "llama-3-8b").model == "llama-3-8b"


# ---- 2. recompute as Megatron-DeepSpeed runs the flags ---------------------------------------

SECTION = {"activation_checkpointing": {"partition_activations": True}}


@pytest.mark.parametrize(("flags", "tp_pp", "policy", "method", "layers"), [
    ("", (2, 2), "none", RecomputeMethod.BLOCK, None),  # the JSON's section alone: none
    ("--recompute-activations", (2, 2), "selective", RecomputeMethod.BLOCK, None),
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
     "--no-pipeline-parallel", (2, 1), "full", RecomputeMethod.BLOCK, 2),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 3",
     (2, 2), "full", RecomputeMethod.UNIFORM, 3),
    ("--checkpoint-activations --checkpoint-num-layers 2 --deepspeed-activation-checkpointing",
     (2, 2), "full", RecomputeMethod.UNIFORM, 2),
    ("--recompute-granularity full --deepspeed-activation-checkpointing --no-pipeline-parallel",
     (2, 1), "full", RecomputeMethod.BLOCK, None),
])
def test_recompute_follows_the_launch_flags(tmp_path, flags, tp_pp, policy, method, layers):
    plan = _ds(_launch(tmp_path, flags, tp=tp_pp[0], pp=tp_pp[1], cfg=SECTION))
    rc = plan.recompute
    assert (rc.policy, rc.method, rc.num_layers) == (RecomputePolicy(policy), method, layers)


@pytest.mark.parametrize(("flags", "pp", "needle"), [
    ("--recompute-granularity full --recompute-method block --recompute-num-layers 2", 2,
     "block: DeepSpeed's pipeline engine (GPTModelPipe) then recomputes nothing"),
    ("--recompute-granularity full --no-pipeline-parallel", 1,
     "not given: GPTModel (--no-pipeline-parallel) then raises"),
    ("--recompute-activations --recompute-method uniform", 2, "uniform with selective"),
])
def test_recompute_megatron_deepspeed_would_not_run_is_refused(tmp_path, capsys, flags, pp,
                                                               needle):
    launch = _launch(tmp_path, flags, pp=pp)
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER], "--recompute-method: " + needle)


DS_FULL = "--checkpoint-activations --deepspeed-activation-checkpointing"


def test_a_launch_keeping_checkpoints_on_the_host_is_refused(tmp_path, capsys):
    """--checkpoint-in-cpu (deepspeed.checkpointing's checkpoint_in_cpu): a plan cannot say it."""
    launch = _launch(tmp_path, f"{DS_FULL} --checkpoint-in-cpu")
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER], "--checkpoint-in-cpu: checkpointed "
                   "activations kept in host memory")


def test_a_launchs_flags_replace_its_jsons_checkpointing_settings(tmp_path, caplog):
    """Megatron-DeepSpeed hands deepspeed.checkpointing.configure its own flags, which replace
    the JSON's: the JSON's cpu_checkpointing is not the run's (imported), its
    --partition-activations under tp 2 is said (priced whole), and without DeepSpeed's
    checkpointing the flags configure nothing (nothing said)."""
    import logging

    host = {"activation_checkpointing": {"cpu_checkpointing": True}}
    assert _ds(_launch(tmp_path, DS_FULL, cfg=host)).recompute.policy == RecomputePolicy.FULL
    with caplog.at_level(logging.WARNING):
        _ds(_launch(tmp_path, f"{DS_FULL} --partition-activations"))
        _ds(_launch(tmp_path, "--checkpoint-activations --partition-activations"))
        _ds(_launch(tmp_path, f"{DS_FULL} --partition-activations", tp=1, pp=2))
    said = [r.getMessage() for r in caplog.records if "partition" in r.getMessage()]
    assert len(said) == 1 and "2 tensor-parallel ranks" in said[0]


def test_a_plain_deepspeed_launch_runs_its_jsons_checkpointing_settings(tmp_path, capsys):
    """No Megatron-DeepSpeed flags (a launch of the user's own script, as export writes for
    tp = pp = 1): the JSON's cpu_checkpointing is the run's, and refused."""
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1},
        "activation_checkpointing": {"cpu_checkpointing": True}}))
    launch = tmp_path / "ds.launch.sh"
    launch.write_text("deepspeed --num_nodes=1 --num_gpus=8 train.py --deepspeed "
                      "--deepspeed_config ds.json\n")
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER], "activation_checkpointing.cpu_checkpointing")


def test_distributed_saved_activations_are_said_to_be_priced_whole(tmp_path, caplog, capsys):
    """Megatron's --distribute-saved-activations splits full recompute's checkpoints over the
    TP group; a plan cannot say it, so import says the plan prices them whole. Where Megatron
    refuses it (tp 1, not full recompute, with sequence parallelism) import refuses too."""
    import logging

    base = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
            "--vocab-size 51200 --micro-batch-size 2 --bf16 --distribute-saved-activations ")
    full = "--recompute-granularity full --recompute-method uniform "
    with caplog.at_level(logging.WARNING):
        assert _megatron(_args(tmp_path, base + full + "--tensor-model-parallel-size 2")
                         ).recompute.policy == RecomputePolicy.FULL
    said = [r.getMessage() for r in caplog.records if "distribute" in r.getMessage()]
    assert len(said) == 1 and "2 tensor-parallel ranks" in said[0]
    for extra, words in ((full + "--tensor-model-parallel-size 1", "tp=1"),
                         ("--recompute-activations --tensor-model-parallel-size 2",
                          "selective recompute"),
                         (full + "--tensor-model-parallel-size 2 --sequence-parallel",
                          "with --sequence-parallel")):
        args = _args(tmp_path, base + extra)
        assert_refused(capsys, ["import", str(args), "--from", "megatron", "--cluster",
                                CLUSTER, "--num-gpus", "8"],
                       f"megatron arguments {args} --distribute-saved-activations: ", words)


def test_a_null_activation_checkpointing_section_is_no_recompute(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 4,
                               "activation_checkpointing": None}))
    plan = import_deepspeed(cfg, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=8)
    assert plan.recompute.policy == RecomputePolicy.NONE


def test_an_activation_checkpointing_section_is_read_as_full_recompute_and_said(tmp_path,
                                                                                 caplog):
    """The section configures deepspeed.checkpointing; whether the script checkpoints its blocks
    the JSON does not show: the import takes full recompute, as export writes it, and says so
    with the way out (a user test found it silent)."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 4,
                               "activation_checkpointing": {"partition_activations": False}}))
    with caplog.at_level("WARNING"):
        plan = import_deepspeed(cfg, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=8)
    assert plan.recompute.policy == RecomputePolicy.FULL
    assert "--set recompute.policy=none" in caplog.text and "activation_checkpointing" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # the recompute chosen by --set is no guess
        import_deepspeed(cfg, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=8,
                         assignments=["recompute.policy=full"])
    assert "activation_checkpointing" not in caplog.text
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 4}))
    with caplog.at_level("WARNING"):
        assert import_deepspeed(cfg, model="gpt3-1.3b", cluster=CLUSTER,
                                num_gpus=8).recompute.policy == RecomputePolicy.NONE
    assert "activation_checkpointing" not in caplog.text


# ---- 4, 5. query groups and degrees ----------------------------------------------------------


def test_group_query_attention_without_a_count_is_one_query_group(tmp_path):
    args = _args(tmp_path, "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
                           "--seq-length 2048 --vocab-size 51200 --micro-batch-size 2 --bf16 "
                           "--group-query-attention")
    assert _megatron(args).model_spec().kv_heads == 1


@pytest.mark.parametrize("tp", ["0", "-2"])
def test_a_launch_degree_below_one_is_refused_naming_the_flag(tmp_path, capsys, tp):
    """tp 0 imported as tp 1; -2 reached the JSON's batch check as 'split -1 ways'."""
    launch = _launch(tmp_path, "")
    launch.write_text(launch.read_text().replace("--tensor-model-parallel-size 2",
                                                 f"--tensor-model-parallel-size {tp}"))
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER],
                   f"--tensor-model-parallel-size: got {tp}; expected a positive integer")


# ---- 7. --out is never a file the import reads -----------------------------------------------


@pytest.mark.parametrize("link", [False, True])
def test_out_over_the_deepspeed_json_the_launch_reads_is_refused(tmp_path, capsys, link):
    launch = _launch(tmp_path, "--checkpoint-activations")
    config = tmp_path / "ds.json"
    before = config.read_text()
    out = config
    if link:
        out = tmp_path / "plan.yaml"
        out.symlink_to(config)
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER, "--out", str(out), "--force"],
                   "--out:", "is a file the import reads")
    assert config.read_text() == before


# ---- also: precision and sequence parallelism -----------------------------------------------


def test_fp16_with_bf16_is_refused(tmp_path, capsys):
    args = _args(tmp_path, f"{GPT3_1_3B} --fp16 --micro-batch-size 2")
    assert_refused(capsys, ["import", str(args), "--from", "megatron", "--cluster", CLUSTER,
                            "--num-gpus", "8"], "--fp16: given with --bf16")
    launch = _launch(tmp_path, "--fp16")
    assert_refused(capsys, ["import", str(launch), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER], "--fp16: given with --bf16")


def test_apex_amp_is_refused_not_read_as_fp32(tmp_path, capsys):
    cfg = tmp_path / "amp.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 4,
                               "amp": {"enabled": True, "opt_level": "O1"}}))
    assert_refused(capsys, ["import", str(cfg), "--from", "deepspeed", "--model", "gpt3-1.3b",
                            "--cluster", CLUSTER, "--num-gpus", "8"], "amp.enabled: true")


def test_sequence_parallel_at_tp_1_imports_off_as_megatron_runs_it(tmp_path):
    args = _args(tmp_path, f"{GPT3_1_3B} --micro-batch-size 2 --sequence-parallel")
    assert _megatron(args).sequence_parallel is False
    launch = _launch(tmp_path, "--sequence-parallel", tp=1, pp=2)
    assert _ds(launch).sequence_parallel is False
    assert _ds(_launch(tmp_path, "--sequence-parallel", tp=2, pp=2)).sequence_parallel is True


# ---- settings a plan cannot say are refused, not priced as something else --------------------

@pytest.mark.parametrize("flags, needle", [
    ("--context-parallel-size 2 --cp-comm-type a2a", "--cp-comm-type: a2a: all-to-all"),
    ("--context-parallel-size 2 --cp-comm-type p2p a2a+p2p", "all-to-all context parallelism"),
    ("--context-parallel-size 2 --cp-comm-type ring", "expected one of p2p, all_gather"),
    ("--optimizer sgd", "--optimizer: got 'sgd'"),
    ("--cpu-offloading", "--cpu-offloading: offloads"),
])
def test_megatron_settings_a_plan_cannot_say_are_refused(tmp_path, capsys, flags, needle):
    args = _args(tmp_path, f"{GPT3_1_3B} --micro-batch-size 2 {flags}")
    assert_refused(capsys, ["import", str(args), "--from", "megatron", "--cluster", CLUSTER,
                            "--num-gpus", "8"], needle)


@pytest.mark.parametrize("flags", ["--context-parallel-size 2 --cp-comm-type p2p",
                                   "--context-parallel-size 2 --cp-comm-type allgather",
                                   "--context-parallel-size 2 --cp-comm-type all_gather",
                                   "--cp-comm-type a2a", "--optimizer adam"])
def test_ring_context_parallelism_and_adam_import(tmp_path, flags):
    """The ring (p2p, as `export --to megatron` writes it; all_gather as Transformer Engine
    spells it, allgather as Megatron's help does) is what autoplan plans; a2a without cp > 1
    changes nothing."""
    plan = _megatron(_args(tmp_path, f"{GPT3_1_3B} --micro-batch-size 2 {flags}"))
    assert plan.parallel.cp == (2 if "--context-parallel-size 2" in flags else 1)


@pytest.mark.parametrize("flags, said", [("--context-parallel-size 2 --cp-comm-type all_gather", True),
                                         ("--context-parallel-size 2 --cp-comm-type allgather", True),
                                         ("--context-parallel-size 2 --cp-comm-type p2p", False),
                                         ("--cp-comm-type all_gather", False)])
def test_all_gather_context_parallelism_says_how_to_price_it(tmp_path, caplog, flags, said):
    """A plan carries no runtime and the megatron presets price TE's P2P ring, so an imported
    all_gather run is told which traits price its exchange (at cp 1 there is none)."""
    with caplog.at_level(logging.WARNING):
        _megatron(_args(tmp_path, f"{GPT3_1_3B} --micro-batch-size 2 {flags}"))
    notes = [r.getMessage() for r in caplog.records if "cp_exchange: all-gather" in r.getMessage()]
    assert len(notes) == (1 if said else 0)
