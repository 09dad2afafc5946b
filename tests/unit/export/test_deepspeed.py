"""DeepSpeed export: DeepSpeed's own DeepSpeedConfig parses and checks the JSON (batch arithmetic
against the data-parallel size included); 3D plans launch Megatron-DeepSpeed, whose flags are
parsed by DeepSpeed's launcher and Megatron-DeepSpeed's own definitions; plain plans round-trip
export -> import -> export."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.deepspeed import ds_config
from autoplan.export.deepspeed_import import deepspeed_plan_dict
from autoplan.export.importers import import_deepspeed
from autoplan.export.registry import get_target
from autoplan.plan import Batch, Offload, Parallel, Pipeline, Recompute, RecomputePolicy, Schedule

from .cases import CASES, plan
from .consumers import bash_syntax_ok, run_script

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "deepspeed" in ok]
THREE_D = [n for n in EXPRESSIBLE if CASES[n][0].parallel.tp > 1 or CASES[n][0].parallel.pp > 1]
PLAIN = [n for n in EXPRESSIBLE if n not in THREE_D]
# Top-level keys in DeepSpeed's configuration reference (deepspeed.ai/docs/config-json/).
DOCUMENTED = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "activation_checkpointing",
    "communication_data_type",
    "data_types",  # grad_accum_dtype ("Data Type options")
}


def _render(case: str) -> dict[str, str]:
    p = CASES[case][0]
    return export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions(gpus_per_node=8))


def deepspeed_parse(cfg: dict, dp: int):
    """DeepSpeed's DeepSpeedConfig, told the data-parallel size the way an engine tells it."""
    config = pytest.importorskip("deepspeed.runtime.config")

    class Mpu:  # what deepspeed.initialize(mpu=...) supplies
        def get_data_parallel_world_size(self) -> int:
            return dp

    with mock.patch.object(config.dist, "get_rank", return_value=0):
        return config.DeepSpeedConfig(cfg, mpu=Mpu())


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_deepspeed_parses_the_config(case: str):
    p = CASES[case][0]
    cfg = json.loads(_render(case)["ds_config.json"])
    assert set(cfg) <= DOCUMENTED
    ds = deepspeed_parse(cfg, p.parallel.dp)
    assert ds.train_batch_size == p.batch.global_batch_size
    assert ds.train_micro_batch_size_per_gpu == p.batch.micro_batch_size
    assert ds.gradient_accumulation_steps == p.num_microbatches
    assert ds.zero_optimization_stage == p.zero_stage
    zero = ds.zero_config
    assert (zero.offload_optimizer is not None) == p.offload.optimizer
    assert (zero.offload_param is not None) == p.offload.params
    assert ds.bfloat16_config.enabled == (p.precision.value == "bf16")
    reduce = {None: None, "fp32": "float32", "bf16": "bfloat16"}[
        p.grad_reduce_dtype and p.grad_reduce_dtype.value]
    assert (ds.communication_data_type and str(ds.communication_data_type)) in (
        None, f"torch.{reduce}")
    assert (ds.communication_data_type is None) == (reduce is None)
    assert ds.float16_config.enabled == (p.precision.value == "fp16")
    assert ds.tensor_parallel_config.autotp_size == 0  # Megatron's tensor parallelism, not AutoTP


def test_deepspeed_rejects_inconsistent_batch():
    cfg = json.loads(_render("dp-zero1")["ds_config.json"])
    with pytest.raises(AssertionError, match="train_batch_size"):
        deepspeed_parse(cfg, dp=CASES["dp-zero1"][0].parallel.dp * 2)


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_launch_command_is_valid_bash(tmp_path: Path, case: str):
    path = tmp_path / "launch.sh"
    path.write_text(_render(case)["launch.sh"])
    bash_syntax_ok(path)


@pytest.mark.parametrize("case", PLAIN)
def test_export_import_export_round_trips(tmp_path: Path, case: str):
    p = CASES[case][0]
    first = _render(case)["ds_config.json"]
    path = tmp_path / "ds_config.json"
    path.write_text(first)
    back = import_deepspeed(path, model=str(p.model), cluster=p.cluster.profile, num_gpus=None)
    assert back == p
    again = export_plan(
        get_target("deepspeed"), back, back.model_spec(), ExportOptions(gpus_per_node=8)
    )
    assert again["ds_config.json"] == first


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"parallel": Parallel(dp=4, pp=4), "zero_stage": 2}, "supports ZeRO stage 0 or 1"),
        ({"recompute": Recompute(RecomputePolicy.SELECTIVE)}, "attention-only recompute"),
        ({"parallel": Parallel(dp=8, cp=2)}, "Ulysses"),
        (
            {"parallel": Parallel(dp=4, pp=4), "pipeline": Pipeline(Schedule.INTERLEAVED_1F1B, 2)},
            "non-interleaved 1F1B",
        ),
        ({"offload": Offload(params=True), "zero_stage": 2}, "needs zero_stage=3"),
        ({"batch": Batch(3, 100)}, "global_batch_size=100 is not divisible by dp=16"),
    ],
)
def test_refusals_name_the_reason(changes: dict, why: str):
    p = plan(**changes)
    with pytest.raises(ConfigError, match=why) as err:
        export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert err.value.exit_code == 2


def test_import_fills_batch_keys_deepspeed_may_derive():
    data = deepspeed_plan_dict(
        {"train_batch_size": 64, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}},
        num_gpus=16,
        what="t",
    )
    assert data["parallel"]["dp"] == 16 and data["batch"]["micro_batch_size"] == 1


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        ({"train_batch_size": "auto"}, "auto"),
        (
            {
                "train_batch_size": 64,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 3,
            },
            "not a multiple",
        ),
        (
            {
                "train_batch_size": 8,
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
            },
            "nvme",
        ),
        ({"train_batch_size": 8}, "--num-gpus"),
    ],
)
def test_import_rejects_what_a_plan_cannot_hold(cfg: dict, why: str):
    with pytest.raises(ConfigError, match=why):
        deepspeed_plan_dict(cfg, num_gpus=None, what="t")


def test_config_dict_matches_rendered_json():
    p = CASES["dp-zero1"][0]
    assert json.loads(_render("dp-zero1")["ds_config.json"]) == ds_config(p)


def megatron_deepspeed_parser():
    """pretrain_gpt.py's parser: Megatron-DeepSpeed's flags (tests/data/export) plus the installed
    DeepSpeed's add_config_arguments, as megatron/arguments.py builds it."""
    from tests.unit.export.consumers import flags_parser

    deepspeed = pytest.importorskip("deepspeed")
    return deepspeed.add_config_arguments(flags_parser("megatron_deepspeed_flags.yaml"))


def _launched(tmp_path: Path, case: str, out: str = "exp/ds.json"):
    """Export with --out, run launch.sh with `deepspeed` stubbed; DeepSpeed's launcher parser
    reads what it was given and Megatron-DeepSpeed's reads pretrain_gpt.py's arguments."""
    pytest.importorskip("deepspeed")
    from deepspeed.launcher.runner import parse_args as launcher_args

    p = CASES[case][0]
    files = export_plan(get_target("deepspeed"), p, p.model_spec(),
                        ExportOptions(gpus_per_node=8, out=out))
    script = tmp_path / "launch.sh"
    script.write_text(files["launch.sh"])
    bash_syntax_ok(script)
    (tmp_path / "hostfile").write_text("")
    [call] = run_script(script, {"deepspeed": ""}, "--train-iters", "10")
    launcher = launcher_args(call[1:])
    ns, rest = megatron_deepspeed_parser().parse_known_args(launcher.user_args)
    assert rest == ["--train-iters", "10"]  # the user's own arguments come through "$@"
    return p, files, launcher, ns


@pytest.mark.parametrize("case", THREE_D)
def test_megatron_deepspeed_launch_parses_and_matches_the_plan(tmp_path: Path, case: str):
    p, files, launcher, ns = _launched(tmp_path, case)
    assert Path(launcher.user_script).name == "pretrain_gpt.py"
    world = launcher.num_nodes * launcher.num_gpus
    assert world == p.world_size
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (
        p.parallel.tp, p.parallel.pp)
    # validate_args: dp is what tp * pp leave of the world (no Ulysses degree here)
    assert ns.ds_sequence_parallel_size is None
    assert world // (ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size) == \
        p.parallel.dp
    assert ns.no_pipeline_parallel == (p.parallel.pp == 1)
    # the --out file name (#16 item 7), read beside the launch wherever it runs from
    assert ns.deepspeed and ns.deepspeed_config == str(tmp_path / "ds.json")
    assert ns.zero_stage == p.zero_stage
    # validate_args switches sequence parallelism off at tp=1 and needs this variable with it
    assert ns.sequence_parallel == p.sequence_parallel and (p.parallel.tp > 1 or not
                                                            ns.sequence_parallel)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in files["launch.sh"]) == p.sequence_parallel
    assert (ns.micro_batch_size, ns.global_batch_size) == (p.batch.micro_batch_size,
                                                           p.batch.global_batch_size)
    policy = p.recompute.policy.value
    assert ns.checkpoint_activations == (policy == "full")
    assert ns.recompute_granularity == ("selective" if policy == "selective" else None)
    assert ns.bf16 == (p.precision.value == "bf16") and ns.fp16 == (p.precision.value == "fp16")
    m = p.model_spec()
    assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads) == (
        m.num_layers, m.hidden_size, m.ffn, m.num_heads)
    assert ns.num_attention_heads % (ns.num_key_value_heads or ns.num_attention_heads) == 0
    assert ns.max_position_embeddings >= ns.seq_length == m.seq_len
    assert ns.vocab_size + 1 == m.vocab_size  # NullTokenizer adds the EOD token
    cfg = json.loads(files["ds_config.json"])
    assert set(cfg) <= DOCUMENTED
    ds = deepspeed_parse(cfg, p.parallel.dp)
    assert ds.train_batch_size == p.batch.global_batch_size
    assert ds.zero_optimization_stage == ns.zero_stage


def test_gpt3_175b_3d_with_sequence_parallelism_exports_through_the_cli(tmp_path: Path, capsys):
    """Issue #15's acceptance: tp8/pp8/dp16 ZeRO-1 with sequence parallelism, --to deepspeed."""
    from autoplan.commands import main
    from autoplan.plan_files import save_plan

    p = CASES["gpt3-175b-3d-sp"][0]
    plan_path = tmp_path / "plan.yaml"
    save_plan(p, plan_path)
    out = tmp_path / "exp" / "ds.json"
    assert main(["export", str(plan_path), "--to", "deepspeed", "--out", str(out)]) == 0
    cfg = json.loads(out.read_text())
    ds = deepspeed_parse(cfg, dp=16)
    assert (ds.train_batch_size, ds.gradient_accumulation_steps, ds.zero_optimization_stage) == (
        1536, 48, 1)
    launch = (tmp_path / "exp" / "ds.launch.sh").read_text()
    assert '--deepspeed_config "$script_dir"/ds.json' in launch
    for flag in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 8",
                 "--sequence-parallel", "--zero-stage 1", "--deepspeed \\"):
        assert flag in launch


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"parallel": Parallel(dp=4, tp=2, cp=2)}, "no ring context parallelism"),
        ({"parallel": Parallel(dp=4, pp=4), "sequence_parallel": True}, "needs parallel.tp > 1"),
        ({"parallel": Parallel(dp=2, tp=8), "model": "llama-3-8b"}, None),  # 8 | 32 heads, 8 kv
        ({"parallel": Parallel(dp=1, tp=16), "model": "gpt3-13b"}, "does not divide num_heads"),
        ({"parallel": Parallel(dp=8, tp=2), "recompute": Recompute(RecomputePolicy.FULL, 2)},
         "cannot limit recompute"),
        ({"parallel": Parallel(dp=4, pp=4),
          "pipeline": Pipeline(Schedule.ONE_F_ONE_B, 1, (5, 7, 7, 5))}, "evenly"),
        ({"parallel": Parallel(dp=8, tp=2), "zero_stage": 3}, None),  # no pipeline engine: ok
    ],
)
def test_megatron_deepspeed_refusals_name_what_is_missing(changes: dict, why: str | None):
    p = plan(**changes)
    target = get_target("deepspeed")
    if why is None:
        assert target.check(p, p.model_spec(), ExportOptions(gpus_per_node=8)) == []
        return
    with pytest.raises(ConfigError, match=why) as err:
        export_plan(target, p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert err.value.exit_code == 2


@pytest.mark.parametrize("case", THREE_D)
def test_megatron_deepspeed_launch_imports_back_to_the_plan(tmp_path: Path, case: str):
    p = CASES[case][0]
    out = tmp_path / "exp" / "ds.json"
    files = export_plan(get_target("deepspeed"), p, p.model_spec(),
                        ExportOptions(gpus_per_node=8, out=str(out)))
    out.parent.mkdir()
    out.write_text(files["ds_config.json"])
    launch = out.with_name("ds.launch.sh")
    launch.write_text(files["launch.sh"])
    back = import_deepspeed(launch, model=str(p.model), cluster=p.cluster.profile, num_gpus=None)
    assert back == p
    again = export_plan(get_target("deepspeed"), back, back.model_spec(),
                        ExportOptions(gpus_per_node=8, out=str(out)))
    assert again == files


def test_a_launch_whose_flags_contradict_its_config_is_refused(tmp_path: Path):
    p = CASES["gpt3-175b-3d-sp"][0]
    out = tmp_path / "ds.json"
    files = export_plan(get_target("deepspeed"), p, p.model_spec(),
                        ExportOptions(gpus_per_node=8, out=str(out)))
    out.write_text(files["ds_config.json"])
    launch = tmp_path / "ds.launch.sh"
    launch.write_text(files["launch.sh"].replace("--zero-stage 1", "--zero-stage 0"))
    with pytest.raises(ConfigError, match="--zero-stage: the launch says 0"):
        import_deepspeed(launch, model=str(p.model), cluster=p.cluster.profile, num_gpus=None)
    launch.write_text(files["launch.sh"].replace("  --deepspeed \\\n", ""))
    with pytest.raises(ConfigError, match="no --deepspeed flag"):
        import_deepspeed(launch, model=str(p.model), cluster=p.cluster.profile, num_gpus=None)


@pytest.mark.parametrize("case", PLAIN)
def test_plain_launch_imports_back_to_the_plan(tmp_path: Path, case: str):
    """A tp = pp = 1 plan exports a plain DeepSpeed launch of the user's script: importing the
    launch reads its JSON, so one import command serves every exported plan."""
    p = CASES[case][0]
    out = tmp_path / "ds.json"
    files = export_plan(get_target("deepspeed"), p, p.model_spec(),
                        ExportOptions(gpus_per_node=8, out=str(out)))
    out.write_text(files["ds_config.json"])
    launch = tmp_path / "ds.launch.sh"
    launch.write_text(files["launch.sh"])
    assert "--num-layers" not in files["launch.sh"]
    back = import_deepspeed(launch, model=str(p.model), cluster=p.cluster.profile,
                            num_gpus=p.world_size)
    assert back == p


def test_json_of_a_split_model_names_the_fix_and_takes_the_degrees_from_set(tmp_path: Path):
    """DeepSpeed's JSON records no Megatron tensor or pipeline parallelism: with --num-gpus its
    batch arithmetic says how many ways the model is split, the error names the two fixes,
    and --set parallel.tp gives the degree the data-parallel size is computed with."""
    p = CASES["gpt3-175b-3d-sp"][0]
    path = tmp_path / "ds.json"
    path.write_text(_render("gpt3-175b-3d-sp")["ds_config.json"])
    split = p.parallel.tp * p.parallel.pp
    with pytest.raises(ConfigError, match=f"split {split} ways.*--set parallel.tp=N"):
        import_deepspeed(path, model=str(p.model), cluster=p.cluster.profile,
                         num_gpus=p.world_size)
    sets = [f"parallel.tp={p.parallel.tp}", f"parallel.pp={p.parallel.pp}"]
    back = import_deepspeed(path, model=str(p.model), cluster=p.cluster.profile,
                            num_gpus=p.world_size, assignments=sets)
    assert (back.parallel.dp, back.parallel.tp, back.parallel.pp) == (
        p.parallel.dp, p.parallel.tp, p.parallel.pp)
    with pytest.raises(ConfigError, match="--set parallel.tp"):
        import_deepspeed(path, model=str(p.model), cluster=p.cluster.profile,
                         num_gpus=p.world_size, assignments=["parallel.tp=two"])


@pytest.mark.parametrize("par", [Parallel(dp=16), Parallel(dp=4, tp=2, pp=2)],
                         ids=["plain", "megatron-deepspeed"])
def test_fp8_is_refused_in_one_line(par: Parallel):
    from autoplan.plan import Precision

    p = plan("llama-3-8b", 16, parallel=par, zero_stage=1, precision=Precision.FP8,
             sequence_parallel=par.tp > 1)
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert "precision fp8" in str(err.value) and "\n" not in str(err.value)


def _optimizer_deepspeed_picks(cfg: dict, dp: int) -> str:
    """deepspeed 0.19.8's own choice (DeepSpeedEngine._do_optimizer_sanity_check) for `cfg`."""
    import torch

    engine_module = pytest.importorskip("deepspeed.runtime.engine")
    engine = object.__new__(engine_module.DeepSpeedEngine)  # no process group needed
    object.__setattr__(engine, "_config", deepspeed_parse(cfg, dp))
    object.__setattr__(engine, "pipeline_parallelism", True)  # as PipelineEngine sets it
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    with mock.patch.object(engine_module.dist, "get_rank", return_value=0):
        return engine._do_optimizer_sanity_check(adam)


@pytest.mark.parametrize(("zero", "offload", "reduce", "grad_accum", "accumulate"), [
    (1, False, None, "fp32", 18.0), (0, False, None, None, 6.0), (1, True, None, None, 0.0),
    (1, False, "bf16", None, 0.0)])
def test_bf16_pipeline_runs_the_bf16_optimizer_it_is_priced_as(
        zero: int, offload: bool, reduce: str | None, grad_accum: str | None,
        accumulate: float):
    """The config asks for what the deepspeed runtime is priced as: BF16_Optimizer accumulating
    in fp32 (18 bytes moved per parameter and micro-batch: cost/rows.py) only at ZeRO-1 with no
    reduce dtype and no optimizer offload, where the config carries data_types.grad_accum_dtype
    fp32 and DeepSpeed itself picks BF16_Optimizer; at ZeRO-0 BF16_Optimizer accumulating in
    bf16 (6 bytes) with no setting; elsewhere the ZeRO optimizer, nothing accumulated apart."""
    from autoplan.cost.rows import rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.plan import ReduceDtype
    from autoplan.plan_table import plan_to_row

    p = plan("gpt3-2.7b", 16, parallel=Parallel(dp=4, pp=4), zero_stage=zero,
             offload=Offload(optimizer=offload), recompute=Recompute(RecomputePolicy.FULL),
             batch=Batch(2, 64),
             grad_reduce_dtype=ReduceDtype(reduce) if reduce else None)
    cfg = json.loads(export_plan(get_target("deepspeed"), p, p.model_spec(),
                                 ExportOptions(gpus_per_node=8))["ds_config.json"])
    assert cfg.get("data_types", {}).get("grad_accum_dtype") == grad_accum
    rows = rows_of(plan_to_row(p, p.model_spec()), p.model_spec(), "bf16",
                   load_runtime("deepspeed"))
    assert list(rows.accumulate_bytes) == [accumulate]
    if accumulate:  # BFLOAT16: BF16_Optimizer, by DeepSpeed's own choice
        assert _optimizer_deepspeed_picks(cfg, dp=4) == "bf16"
    elif not offload:
        assert _optimizer_deepspeed_picks(cfg, dp=4) != "bf16"
