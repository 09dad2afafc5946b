"""Megatron export: the script runs under bash, torchrun's parser reads its launch, Megatron's
flag definitions parse the arguments and Megatron-Core's TransformerConfig validates them;
export -> import -> export round-trips."""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.megatron import layout_string
from autoplan.export.megatron_args import SWITCHES
from autoplan.export.megatron_pipeline import parse_layout
from autoplan.export.registry import get_target
from autoplan.export.shell_args import expand_variables, parse_flags
from autoplan.plan import Parallel, Pipeline, Schedule

from .cases import CASES, plan
from .consumers import DATA, bash_syntax_ok, megatron_parser, run_script, torchrun_args

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "megatron" in ok]


def _script(tmp_path: Path, case: str) -> Path:
    p = CASES[case][0]
    files = export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    return path


def _launch(tmp_path: Path, case: str) -> list[str]:
    path = _script(tmp_path, case)
    bash_syntax_ok(path)
    [call] = run_script(path, {"torchrun": ""}, "--train-iters", "10")
    return call[1:]


def transformer_config(ns):
    """Megatron-Core's TransformerConfig from parsed args, as megatron.training maps them."""
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.enums import AttnBackend
    # megatron.training's validate_args: at most one of the three virtual-pipeline flags.
    vpp_flags = (
        ns.num_layers_per_virtual_pipeline_stage,
        ns.num_virtual_stages_per_pipeline_rank,
        ns.pipeline_model_parallel_layout,
    )
    assert sum(v is not None for v in vpp_flags) <= 1, "Megatron allows one vpp flag"
    dtype = torch.bfloat16 if ns.bf16 else torch.float16 if ns.fp16 else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _config(TransformerConfig, AttnBackend, ns, dtype)


def _config(TransformerConfig, AttnBackend, ns, dtype):  # noqa: N803 (classes passed in)
    return TransformerConfig(
        num_layers=ns.num_layers,
        hidden_size=ns.hidden_size,
        ffn_hidden_size=ns.ffn_hidden_size,
        num_attention_heads=ns.num_attention_heads,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        tensor_model_parallel_size=ns.tensor_model_parallel_size,
        pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
        context_parallel_size=ns.context_parallel_size,
        sequence_parallel=ns.sequence_parallel,
        virtual_pipeline_model_parallel_size=_vpp(ns),
        recompute_granularity=ns.recompute_granularity,
        recompute_method=ns.recompute_method,
        recompute_num_layers=ns.recompute_num_layers,
        gated_linear_unit=ns.swiglu,
        normalization=ns.normalization or "LayerNorm",
        add_bias_linear=not ns.disable_bias_linear,
        hidden_dropout=_or(ns.hidden_dropout, 0.1),
        attention_dropout=_or(ns.attention_dropout, 0.1),
        bf16=ns.bf16,
        fp16=ns.fp16,
        attention_backend=AttnBackend[ns.attention_backend or "auto"],
        pipeline_model_parallel_layout=ns.pipeline_model_parallel_layout,
        params_dtype=dtype,
        pipeline_dtype=dtype,  # megatron.training sets both from --bf16/--fp16
    )


def _or(value, default):  # Megatron's defaults for flags the table leaves unset
    return default if value is None else value


def _vpp(ns) -> int | None:
    if ns.pipeline_model_parallel_layout:  # as validate_args derives it
        stages = ns.pipeline_model_parallel_layout.count("|") + 1
        return stages // ns.pipeline_model_parallel_size
    if ns.num_layers_per_virtual_pipeline_stage:
        per_rank = ns.num_layers // ns.pipeline_model_parallel_size
        return per_rank // ns.num_layers_per_virtual_pipeline_stage
    return ns.num_virtual_stages_per_pipeline_rank


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_megatron_parsers_accept_the_launch(tmp_path: Path, case: str):
    p = CASES[case][0]
    args = torchrun_args(_launch(tmp_path, case))
    assert int(args.nnodes) * int(args.nproc_per_node) == p.world_size
    assert args.training_script == "pretrain_gpt.py"
    assert args.training_script_args[-2:] == ["--train-iters", "10"]  # "$@" passes through
    ns = megatron_parser().parse_args(args.training_script_args[:-2])
    assert (
        ns.tensor_model_parallel_size,
        ns.pipeline_model_parallel_size,
        ns.context_parallel_size,
    ) == (p.parallel.tp, p.parallel.pp, p.parallel.cp)
    assert ns.global_batch_size == p.batch.global_batch_size
    assert ns.use_distributed_optimizer == (p.zero_stage >= 1)
    assert ns.use_megatron_fsdp == (p.zero_stage >= 2)
    config = transformer_config(ns)  # Megatron-Core's own validation
    assert config.sequence_parallel == p.sequence_parallel
    assert config.num_query_groups == p.model_spec().kv_heads


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_export_import_export_round_trips(tmp_path: Path, case: str):
    p = CASES[case][0]
    path = _script(tmp_path, case)
    back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert back == p
    again = export_plan(
        get_target("megatron"), back, back.model_spec(), ExportOptions(gpus_per_node=8)
    )
    assert again["megatron_args.sh"] == path.read_text()


def test_megatron_core_rejects_what_we_refuse():
    """The reason we refuse sequence parallelism without tp is Megatron-Core's own rule."""
    from argparse import Namespace

    ns = megatron_parser().parse_args(
        [
            "--num-layers",
            "4",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--sequence-parallel",
            "--tensor-model-parallel-size",
            "1",
        ]
    )
    with pytest.raises(ValueError, match="sequence parallelism"):
        transformer_config(Namespace(**{**vars(ns), "ffn_hidden_size": 256}))


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"sequence_parallel": True}, "needs parallel.tp > 1"),
        ({"zero_stage": 3, "parallel": Parallel(dp=4, pp=4)}, "Megatron-FSDP"),
        ({"parallel": Parallel(dp=4, pp=4), "pipeline": Pipeline(Schedule.GPIPE)}, "1F1B"),
        (
            {"parallel": Parallel(dp=4, pp=4), "pipeline": Pipeline(layers_per_stage=(5, 5, 5, 5))},
            "layers_per_stage has 4 stages summing to 20",
        ),
        ({"model": "llama-3-8b", "parallel": Parallel(dp=1, tp=16)}, "divide num_kv_heads"),
    ],
)
def test_refusals_name_the_reason(changes: dict, why: str):
    p = plan(**changes)
    with pytest.raises(ConfigError, match=why):
        export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))


def test_import_of_a_hand_written_launch_script():
    text = (DATA / "megatron_gpt3_175b.sh").read_text()
    p = import_megatron(
        DATA / "megatron_gpt3_175b.sh", model=None, cluster="a100-sxm4-80gb", num_gpus=None
    )
    assert "NullTokenizer" not in text
    assert (p.parallel.dp, p.parallel.tp, p.parallel.pp) == (16, 8, 8)
    assert p.sequence_parallel and p.zero_stage == 1
    assert (p.pipeline.schedule, p.pipeline.vpp) == (Schedule.INTERLEAVED_1F1B, 2)
    assert p.recompute.policy.value == "selective" and p.precision.value == "bf16"
    m = p.model_spec()
    assert (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size) == (96, 12288, 96, 51200)
    assert (m.dropout, m.tie_embeddings, m.mlp.value) == (0.1, True, "gelu")


def test_layout_round_trips_and_reads_megatron_shorthand():
    assert parse_layout(layout_string((3, 5, 5, 3)), "t") == (3, 5, 5, 3)
    assert parse_layout("Et*2|(tt|)*3t,L", "t") == (2, 2, 2, 2, 1)
    # multi-token-prediction modules (m) sit in the last stage and hold no stage layer
    assert parse_layout("Et|tmL", "t") == (1, 1)
    with pytest.raises(ConfigError, match="only E, t, m and L"):
        parse_layout("Et|txL", "t")


def test_parse_flags_handles_equals_switches_and_continuations():
    flags = parse_flags(
        "torchrun --nnodes=2 x.py \\\n  --bf16 --tensor-model-parallel-size 4 "
        "# comment --fp16\n --seq-length=2048",
        SWITCHES,
    )
    assert flags == {
        "--nnodes": "2",
        "--bf16": True,
        "--tensor-model-parallel-size": "4",
        "--seq-length": "2048",
    }


def test_shell_variables_are_expanded_and_unknown_gpu_counts_are_errors(tmp_path: Path):
    text = "N=4\nexport TP=2\ntorchrun --nnodes $N --nproc_per_node=${TP} x.py --tensor-model-parallel-size $TP"
    assert parse_flags(expand_variables(text), SWITCHES) == {
        "--nnodes": "4",
        "--nproc_per_node": "2",
        "--tensor-model-parallel-size": "2",
    }
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nnodes $SLURM_NNODES pretrain_gpt.py --micro-batch-size 1\n")
    with pytest.raises(ConfigError, match="--num-gpus"):
        import_megatron(script, model="gpt3-1.3b", cluster="h100-sxm-80gb", num_gpus=None)
    p = import_megatron(script, model="gpt3-1.3b", cluster="h100-sxm-80gb", num_gpus=8)
    assert (p.parallel.dp, p.batch.global_batch_size, p.model) == (8, 8, "gpt3-1.3b")


@pytest.mark.parametrize(("text", "tp", "pp"), [
    # top level: the value assigned above the use, though reassigned below
    ("TP=2\ntorchrun x.py --tensor-model-parallel-size $TP\nTP=4\n", "2", None),
    # a value naming another variable takes its value
    ("SIZE=2\nTP=${SIZE}\ntorchrun x.py --tensor-model-parallel-size $TP\n", "2", None),
    # a function body runs where it is called: the values the script ends with (bash: 4, 16)
    ("TP=2\nlaunch() {\n  torchrun x.py --tensor-model-parallel-size $TP \\\n"
     "    --pipeline-model-parallel-size ${PP}\n}\nTP=4\nPP=16\nlaunch\n", "4", "16"),
    ("TP=2\nfunction launch {\n  torchrun x.py --tensor-model-parallel-size $TP\n}\n"
     "TP=8\nlaunch\n", "8", None),
])
def test_shell_variables_take_the_value_bash_gives_them(text, tp, pp):
    flags = parse_flags(expand_variables(text), SWITCHES)
    assert flags.get("--tensor-model-parallel-size") == tp
    assert flags.get("--pipeline-model-parallel-size") == pp


@pytest.mark.parametrize(("zero", "strategy"), [(2, "optim_grads"), (3, "optim_grads_params")])
def test_zero_2_and_3_run_as_megatron_fsdp(tmp_path, zero: int, strategy: str):
    # Megatron-FSDP's required flags (docs/discussions/megatron-fsdp-user-guide), and the
    # importer reads the stage back
    p = plan(zero_stage=zero)
    files = export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    out = tmp_path / "megatron_args.sh"
    out.write_text(files["megatron_args.sh"])
    text = out.read_text()
    for flag in ("--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--no-gradient-accumulation-fusion", "--ckpt-format fsdp_dtensor"):
        assert flag in text
    back = import_megatron(out, model=p.model, cluster=p.cluster.profile,
                           num_gpus=p.cluster.num_gpus)
    assert back.zero_stage == zero


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_distributed_optimizer_flags_meet_validate_args(tmp_path: Path, case: str):
    """validate_args: --overlap-param-gather needs the distributed optimizer (or Megatron-FSDP)
    and --overlap-grad-reduce; --optimizer-cpu-offload needs --use-precision-aware-optimizer."""
    p = CASES[case][0]
    launch = torchrun_args(_launch(tmp_path, case))
    ns = megatron_parser().parse_args(launch.training_script_args[:-2])
    if ns.overlap_param_gather:
        assert (ns.use_distributed_optimizer or ns.use_megatron_fsdp) and ns.overlap_grad_reduce
    if ns.optimizer_cpu_offload:
        assert ns.use_precision_aware_optimizer
    # overlapped as the megatron runtime prices it (overlap_dp_comm, overlap_param_gather)
    assert ns.overlap_grad_reduce == (p.zero_stage <= 1)
    assert ns.overlap_param_gather == (p.zero_stage == 1)


def test_optimizer_offload_uses_the_precision_aware_optimizer(tmp_path: Path):
    ns = megatron_parser().parse_args(
        torchrun_args(_launch(tmp_path, "llama-megatron-fullblock")).training_script_args[:-2])
    assert ns.optimizer_cpu_offload and ns.use_precision_aware_optimizer
    assert ns.use_distributed_optimizer  # OptimizerConfig asserts it for the precision-aware one


def _connections(tmp_path: Path, p, preset: str | None) -> str:
    """CUDA_DEVICE_MAX_CONNECTIONS as torchrun sees it when the script runs."""
    path = tmp_path / "megatron_args.sh"
    path.write_text(export_plan(get_target("megatron"), p, p.model_spec(),
                                ExportOptions(gpus_per_node=8))["megatron_args.sh"])
    stub = tmp_path / "bin" / "torchrun"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text('#!/bin/bash\nprintf "%s" "${CUDA_DEVICE_MAX_CONNECTIONS-unset}" > "$SEEN"\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env |= {"PATH": f"{stub.parent}:{env['PATH']}", "SEEN": str(tmp_path / "seen"),
            "RDZV_HOST": "node1"}
    if preset is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = preset
    subprocess.run(["bash", str(path)], env=env, check=True, timeout=30)
    return (tmp_path / "seen").read_text()


def test_cuda_device_max_connections_is_what_validate_args_asserts(tmp_path: Path):
    """validate_args: tp > 1 or cp > 1 asserts CUDA_DEVICE_MAX_CONNECTIONS == "1" (before
    Blackwell); Megatron-FSDP asserts it is not "1" (its user guide: unset it)."""
    tp = plan("llama-3-8b", 8, parallel=Parallel(dp=2, tp=4), sequence_parallel=True,
              zero_stage=1)
    assert _connections(tmp_path, tp, preset=None) == "1"
    cp = plan("llama-3-8b", 8, parallel=Parallel(dp=4, cp=2), zero_stage=1)
    assert _connections(tmp_path, cp, preset="8") == "1"
    assert _connections(tmp_path, plan(zero_stage=3), preset="1") == "unset"
    assert _connections(tmp_path, plan(zero_stage=1), preset="8") == "8"  # dp only: left alone


def test_mtp_layers_sit_in_the_uneven_layout_megatron_core_validates(tmp_path: Path):
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )
    from autoplan.model_spec import PRESETS

    model = PRESETS["llama-3-8b"].replace(mtp_layers=2)
    p = plan(model, 16, parallel=Parallel(dp=2, tp=2, pp=4), sequence_parallel=True,
             zero_stage=1, pipeline=Pipeline(Schedule.ONE_F_ONE_B, 1, (7, 9, 9, 7)))
    files = export_plan(get_target("megatron"), p, model, ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    [call] = run_script(path, {"torchrun": ""})
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.pipeline_model_parallel_layout == "Et*7|t*9|t*9|t*7m*2L"
    layout = PipelineParallelLayerLayout(ns.pipeline_model_parallel_layout,
                                         ns.pipeline_model_parallel_size)
    layout.validate_layer_layout(num_layers=ns.num_layers, mtp_num_layers=ns.mtp_num_layers)
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back == p.replace(model=back.model) and back.model_spec().mtp_layers == 2


def test_a_rope_model_sets_its_base(tmp_path: Path):
    """--rotary-base is the model's rope_theta (llama-3-8b: 500000, not Megatron's default
    10000, Llama 2's), parsed by Megatron's own flag table as an int; a learned-position model
    gets none."""
    path = _script(tmp_path, "llama-uneven-vpp")  # llama-3-8b
    [call] = run_script(path, {"torchrun": ""})
    assert call.count("--rotary-base") == 1
    assert call[call.index("--rotary-base") + 1] == "500000"
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.position_embedding_type == "rope" and ns.rotary_base == 500000
    learned = _script(tmp_path, "dp-zero1").read_text()  # gpt3-1.3b
    assert "learned_absolute" in learned and "rotary" not in learned.lower()
