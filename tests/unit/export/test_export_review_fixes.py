"""`autoplan export` as a reviewer drove it: what each target refuses, the options it takes, the
paths it writes and the words of its refusals.

Launchers refuse what `autoplan train` refuses (its rule set, called the same way); targets whose
tool cannot run on a CPU host refuse a CPU profile's plan; options a target does not write are
refused, never dropped; the DeepSpeed launch finds its config from the folder it is run in; --out
never names the plan, a folder or nothing; every reason is said once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan import (
    Batch,
    ClusterRef,
    Offload,
    Parallel,
    Pipeline,
    Plan,
    Precision,
    Recompute,
    RecomputeModule,
    RecomputePolicy,
    Schedule,
)
from autoplan.plan_files import load_plan, save_plan

from .cases import CASES, LAUNCHERS, plan
from .consumers import run_script, torchrun_args

FP8_TP = plan("llama-3-8b", 8, parallel=Parallel(dp=4, tp=2), sequence_parallel=True,
              zero_stage=3, precision=Precision.FP8, recompute=Recompute(RecomputePolicy.FULL),
              batch=Batch(1, 64))
"""fp8 with tensor parallelism (in memory, 26 GiB per GPU): Megatron runs it; autoplan's runtime
does not (torchao's float8 layers have no tensor-parallel styles there), so `autoplan train`
refuses it."""
CPU_PLAN = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", 4), parallel=Parallel(dp=4),
                batch=Batch(micro_batch_size=2, global_batch_size=8))
CPU_3D = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", 4), parallel=Parallel(dp=2, tp=2),
              batch=Batch(micro_batch_size=2, global_batch_size=8))
CPU_LAYERNORM_TP = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", 4),
                        parallel=Parallel(dp=2, tp=2), batch=Batch(2, 8),
                        recompute=Recompute(RecomputePolicy.SELECTIVE,
                                            modules=(RecomputeModule.LAYERNORM,)))
"""A CPU plan the plan rules accept and autoplan's runtime refuses (layernorm recompute beside
tp): what `autoplan train` on this (CPU) machine says of it is checkable here."""


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def run(capsys, tmp_path: Path, p: Plan, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `autoplan export PLAN ARGV...`."""
    capsys.readouterr()
    plan_file = save_plan(p, tmp_path / "plan.yaml", overwrite=True)
    code = main(["export", str(plan_file), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str) -> None:
    assert code == 2 and err.count("\n") == 1, err


# 1. launchers refuse what `autoplan train` refuses ---------------------------------------------


@pytest.mark.parametrize("target", LAUNCHERS)
def test_launchers_refuse_a_plan_autoplan_train_refuses(tmp_path: Path, capsys,
                                                        target: str) -> None:
    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import load_runtime

    out = tmp_path / "job.out"
    code, _, err = run(capsys, tmp_path, FP8_TP, "--to", target, "--out", str(out))
    refused(code, err)
    expected = refusals(FP8_TP, load_runtime("autoplan-cuda"), FP8_TP.model_spec())
    assert expected and all(r in err for r in expected)
    assert "precision fp8 with tp=2" in err and listing(tmp_path) == ["plan.yaml"]
    code, _, err = run(capsys, tmp_path, FP8_TP, "--to", "megatron")  # it runs fp8 with tp
    assert code == 0, err


@pytest.mark.parametrize("target", LAUNCHERS)
def test_launchers_refuse_what_train_refuses_on_this_cpu_machine(tmp_path: Path, capsys,
                                                                 target: str) -> None:
    """A CPU profile's plan, judged here by `autoplan train`'s own check (runtime_problems):
    every problem it names, the launcher export names."""
    from autoplan.runtime.validation import runtime_problems

    problems = runtime_problems(CPU_LAYERNORM_TP, CPU_LAYERNORM_TP.model_spec())
    assert problems
    code, _, err = run(capsys, tmp_path, CPU_LAYERNORM_TP, "--to", target)
    refused(code, err)
    assert all(problem in err for problem in problems), (problems, err)


@pytest.mark.parametrize("target", LAUNCHERS)
def test_launchers_refuse_a_plan_that_does_not_fit_as_train_does(tmp_path: Path, capsys,
                                                                 target: str) -> None:
    """`autoplan train`'s launcher refuses (exit 3) a plan the cost model says does not fit
    (runtime/launch.memory_preflight); the ranks a launcher export starts under torchrun do not
    check again, so the export refuses it, writing nothing, unless told --no-memory-check."""
    from autoplan.runtime.launch import memory_preflight

    big = plan("gpt3-175b", 8, zero_stage=1)  # 175B parameters' states on 8 GPUs
    with pytest.raises(Exception) as train_says:
        memory_preflight(type("Args", (), {"plan": "plan.yaml"})(), big, big.model_spec())
    assert getattr(train_says.value, "exit_code", None) == 3
    out = tmp_path / "job.out"
    code, stdout, err = run(capsys, tmp_path, big, "--to", target, "--out", str(out))
    assert code == 3 and stdout == "" and err.count("\n") == 1, err
    assert "does not fit 8 x h100-sxm-80gb as autoplan-cuda runs it: needs" in err
    assert "--no-memory-check" in err and listing(tmp_path) == ["plan.yaml"]
    code, _, err = run(capsys, tmp_path, big, "--to", target, "--out", str(out),
                       "--no-memory-check")
    assert code == 0 and out.exists(), err



@pytest.mark.parametrize(("target", "zero"), [("megatron", 1), ("deepspeed", 3),
                                             ("torchtitan", 3)])
def test_a_framework_export_refuses_a_plan_its_engine_would_not_fit(tmp_path: Path, capsys,
                                                                   target: str, zero: int) -> None:
    """A framework's config of a plan that does not fit as that engine holds it (the target's
    runtime traits) is refused as a launcher's job is (exit 3, nothing written, the shortfall
    named), not written with a warning; --no-memory-check writes it anyway."""
    big = plan("llama-3-70b", 8, zero_stage=zero)  # 70B parameters' states on 8 GPUs
    out = tmp_path / ("cfg_job.py" if target == "torchtitan" else "cfg.out")
    code, stdout, err = run(capsys, tmp_path, big, "--to", target, "--out", str(out))
    assert code == 3 and stdout == "" and err.count("\n") == 1, err
    assert "does not fit 8 x h100-sxm-80gb as" in err and "needs" in err
    assert "`autoplan search --runtime " in err and "--no-memory-check" in err
    assert listing(tmp_path) == ["plan.yaml"]
    code, _, err = run(capsys, tmp_path, big, "--to", target, "--out", str(out),
                       "--no-memory-check")
    assert code == 0 and out.exists(), err
    assert "cannot run it as planned: needs" in err  # the price line still says so


def test_the_price_line_tells_a_missing_feature_from_missing_memory() -> None:
    from autoplan.export.pricing import price_for_target

    line = price_for_target(FP8_TP, FP8_TP.model_spec(), "slurm")
    assert "does not fit" not in line
    assert "autoplan-cuda cannot run it as planned: precision fp8 with tp=2" in line
    big = plan("gpt3-175b", 8, zero_stage=1)  # 175B parameters' states on 8 GPUs
    line = price_for_target(big, big.model_spec(), "megatron")
    assert "megatron cannot run it as planned: needs" in line and "GiB per GPU of" in line


# 3. options a target does not write are refused ------------------------------------------------


@pytest.mark.parametrize("target, case, flag, value", [
    ("megatron", "megatron-3d", "--checkpoint-dir", "/ckpt"),
    ("deepspeed", "dp-zero1", "--job-name", "foo"),
    ("deepspeed", "dp-zero1", "--checkpoint-dir", "/ckpt"),
    ("deepspeed", "dp-zero1", "--max-restarts", "9"),
    ("torchtitan", "llama-uneven-pp", "--job-name", "foo"),
    ("torchtitan", "llama-uneven-pp", "--checkpoint-dir", "/ckpt"),
    ("torchtitan", "llama-uneven-pp", "--max-restarts", "2"),
    ("deepspeed", "dp-zero1", "--checkpoint-dir", "checkpoints"),  # the default, given
])
def test_an_option_the_target_does_not_write_is_refused(tmp_path: Path, capsys, target: str,
                                                        case: str, flag: str,
                                                        value: str) -> None:
    out = tmp_path / "job.out"
    code, _, err = run(capsys, tmp_path, CASES[case][0], "--to", target, flag, value,
                       "--out", str(out))
    refused(code, err)
    assert f"{flag}: --to {target} writes no {flag[2:]}" in err
    assert listing(tmp_path) == ["plan.yaml"]


def test_megatron_writes_max_restarts_and_the_job_name_on_its_torchrun(tmp_path: Path,
                                                                       capsys) -> None:
    out = tmp_path / "m.sh"
    code, _, err = run(capsys, tmp_path, CASES["megatron-3d"][0], "--to", "megatron",
                       "--max-restarts", "7", "--job-name", "llm", "--out", str(out))
    assert code == 0, err
    [call] = run_script(out, {"torchrun": ""})
    args = torchrun_args(call[1:])
    assert (args.max_restarts, args.rdzv_id) == (7, "llm")
    code, _, err = run(capsys, tmp_path, CASES["megatron-3d"][0], "--to", "megatron",
                       "--out", str(out), "--force")
    assert code == 0 and "--max-restarts" not in out.read_text()  # torchrun's own default


def test_launchers_keep_their_defaults(tmp_path: Path, capsys) -> None:
    code, text, _ = run(capsys, tmp_path, CASES["dp-zero1"][0], "--to", "slurm")
    assert code == 0
    assert "#SBATCH --job-name=autoplan" in text and "--max-restarts=3" in text
    assert f"--checkpoint-dir {os.path.abspath('checkpoints')}" in text


# 4. tools that need CUDA refuse a CPU profile's plan -------------------------------------------


@pytest.mark.parametrize("target, p, tool", [
    ("megatron", CPU_PLAN, "Megatron-LM"),
    ("deepspeed", CPU_PLAN, "DeepSpeed"),
    ("deepspeed", CPU_3D, "Megatron-DeepSpeed"),
    ("torchtitan", CPU_PLAN, "torchtitan"),
])
def test_a_cpu_plan_is_refused_where_the_tool_needs_a_gpu(tmp_path: Path, capsys, target: str,
                                                          p: Plan, tool: str) -> None:
    out = tmp_path / ("job.py" if target == "torchtitan" else "job.out")  # a name it takes
    code, _, err = run(capsys, tmp_path, p, "--to", target, "--out", str(out))
    refused(code, err)
    assert "cluster.profile cpu-gloo is a CPU host: " + tool in err
    assert listing(tmp_path) == ["plan.yaml"]
    code, _, err = run(capsys, tmp_path, p, "--to", "torchrun")  # autoplan train runs it
    assert code == 0, err


# 5. the DeepSpeed launch names its config wherever it runs from --------------------------------


@pytest.mark.parametrize("case", ["gpt3-175b-3d-sp", "single-node-tp", "dp-zero1"])
def test_deepspeed_launch_finds_its_config_from_another_folder(tmp_path: Path, capsys,
                                                              monkeypatch, case: str) -> None:
    """Exported with a relative --out, run from the Megatron-DeepSpeed checkout (3D) or the
    user's training folder (plain DeepSpeed): the config path the launch passes names the
    JSON written."""
    monkeypatch.chdir(tmp_path)
    save_plan(CASES[case][0], tmp_path / "plan.yaml")
    assert main(["export", "plan.yaml", "--to", "deepspeed", "--out", "o3/ds3.json",
                 "--no-memory-check"]) == 0  # the path is the subject, not the fit
    checkout = tmp_path / "Megatron-DeepSpeed"
    checkout.mkdir()
    (tmp_path / "o3" / "hostfile").write_text("")  # the nodes too are read beside the launch
    [call] = run_script(tmp_path / "o3" / "ds3.launch.sh", {"deepspeed": ""}, cwd=checkout)
    hostfiles = [w.partition("=")[2] for w in call if w.startswith("--hostfile=")]
    several = CASES[case][0].world_size > 8  # nodes of 8 GPUs
    assert [Path(h).resolve() for h in hostfiles] == \
        [(tmp_path / "o3" / "hostfile").resolve()] * several
    i = next(i for i, w in enumerate(call) if w.startswith("--deepspeed_config"))
    path = call[i].partition("=")[2] or call[i + 1]
    config = checkout / path  # as the launched process opens it, from its working folder
    assert config.is_file() and config.samefile(tmp_path / "o3" / "ds3.json")
    assert json.loads(config.read_text())["train_batch_size"] == \
        CASES[case][0].batch.global_batch_size
    monkeypatch.chdir(checkout)  # import reads it back from elsewhere too
    argv = ["import", str(tmp_path / "o3" / "ds3.launch.sh"), "--from", "deepspeed", "--model",
            CASES[case][0].model, "--cluster", "h100-sxm-80gb", "--out", "back.yaml"]
    assert main(argv) == 0
    back = load_plan(checkout / "back.yaml")
    assert back.parallel == CASES[case][0].parallel and back.batch == CASES[case][0].batch


# 6. a control character in --out --------------------------------------------------------------


@pytest.mark.parametrize("target, case, name, extra", [
    ("megatron", "megatron-3d", "a\nb.sh", ()),
    ("torchtitan", "llama-uneven-pp", "a\nb.toml", ("--torchtitan-format", "toml")),
    ("torchtitan", "llama-uneven-pp", "a\nb.py", ()),
])
def test_out_with_a_line_break_is_refused_where_the_file_names_it(
        tmp_path: Path, capsys, target: str, case: str, name: str,
        extra: tuple[str, ...]) -> None:
    code, _, err = run(capsys, tmp_path, CASES[case][0], "--to", target, *extra,
                       "--out", str(tmp_path / name))
    refused(code, err)
    assert "--out" in err and "control characters" in err
    assert listing(tmp_path) == ["plan.yaml"]


# 7. --out never replaces the plan -------------------------------------------------------------


@pytest.mark.parametrize("target, plan_name, out_name, extra", [
    ("slurm", "plan.yaml", "plan.yaml", ()),
    ("slurm", "plan.yaml", "plan.yaml", ("--format", "json")),
    ("deepspeed", "ds.launch.sh", "ds.json", ()),  # the launch goes beside: ds.launch.sh
    ("megatron", "plan.yaml", "link.sh", ()),  # a link to the plan
])
def test_out_that_is_the_plan_is_refused_even_with_force(tmp_path: Path, capsys, target: str,
                                                        plan_name: str, out_name: str,
                                                        extra: tuple[str, ...]) -> None:
    plan_file = save_plan(CASES["dp-zero1"][0], tmp_path / plan_name)
    if out_name == "link.sh":
        (tmp_path / out_name).symlink_to(plan_file)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    code = main(["export", str(plan_file), "--to", target, "--out", str(tmp_path / out_name),
                 "--force", *extra])
    err = capsys.readouterr().err
    refused(code, err)
    assert "is the plan being exported" in err
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


# 8. --out names a file ------------------------------------------------------------------------


@pytest.mark.parametrize("out", ["", "newdir/", "newdir/.", "newdir/.."])
def test_out_that_names_no_file_is_refused(tmp_path: Path, capsys, monkeypatch,
                                           out: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run(capsys, tmp_path, CASES["dp-zero1"][0], "--to", "slurm",
                            "--out", out)
    refused(code, err)
    assert err.startswith("autoplan export: error: --out: ") and stdout == ""
    assert listing(tmp_path) == ["plan.yaml"]


@pytest.mark.parametrize("out", ["", "newdir/", "SAME"])
def test_import_out_names_a_file_other_than_its_input(tmp_path: Path, capsys, monkeypatch,
                                                      out: str) -> None:
    """`import --out` as export's: no silent stdout, no file named after a folder, and never
    the config being read (--force or not)."""
    monkeypatch.chdir(tmp_path)
    save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    assert main(["export", "plan.yaml", "--to", "deepspeed", "--out", "ds.json"]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    code = main(["import", "ds.json", "--from", "deepspeed", "--model", "gpt3-1.3b",
                 "--cluster", "h100-sxm-80gb", "--out", "ds.json" if out == "SAME" else out,
                 "--force"])
    stdout, err = capsys.readouterr()
    refused(code, err)
    assert err.startswith("autoplan import: error: --out: ") and stdout == ""
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_format_wrapper_at_out_says_it_wrote_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "wrapped.json"
    code, _, err = run(capsys, tmp_path, CASES["dp-zero1"][0], "--to", "slurm",
                       "--format", "json", "--out", str(out))
    assert code == 0 and f"wrote {out}\n" in err and json.loads(out.read_text())["files"]


# 11. --elastic and --min-nodes refusals say what is true --------------------------------------


@pytest.mark.parametrize("target", ["torchrun", "megatron", "deepspeed", "torchtitan"])
def test_elastic_refusal_says_the_target_writes_no_elastic_job(tmp_path: Path, capsys,
                                                              target: str) -> None:
    code, _, err = run(capsys, tmp_path, CASES["megatron-3d"][0], "--to", target, "--elastic")
    refused(code, err)
    assert "not launched by torchrun" not in err
    assert f"--elastic: --to {target} writes no elastic job" in err
    assert "export --to slurm or kubernetes, or drop --elastic" in err


@pytest.mark.parametrize("extra", [(), ("--elastic",)])
def test_min_nodes_for_a_target_without_elastic_jobs_asks_for_nothing_refused(
        tmp_path: Path, capsys, extra: tuple[str, ...]) -> None:
    code, _, err = run(capsys, tmp_path, CASES["dp-zero1"][0], "--to", "deepspeed",
                       "--min-nodes", "1", *extra)
    refused(code, err)
    assert "add --elastic" not in err and "writes no" in err


# 12. each reason once ---------------------------------------------------------------------------

TWICE = [  # (plan, targets, markers of one reason: together they may occur once)
    (plan(parallel=Parallel(dp=8)), ("slurm", "deepspeed", "megatron", "torchtitan"),
     ("dp * tp * pp * cp", "dp*tp*pp*cp")),
    (plan("llama-3-8b", batch=Batch(3, 100)), ("deepspeed", "megatron", "torchtitan"),
     ("global_batch_size",)),
    (plan("llama-3-8b", parallel=Parallel(dp=4, tp=1, pp=4),
          pipeline=Pipeline(Schedule.ONE_F_ONE_B, 1, (7, 9, 9, 8))),
     ("deepspeed", "megatron", "torchtitan"), ("layers_per_stage", "layers do not fit")),
    (plan("llama-3-8b", sequence_parallel=True), ("deepspeed", "megatron", "torchtitan"),
     ("sequence_parallel",)),
    (plan("llama-3-8b", parallel=Parallel(dp=4, pp=4),
          pipeline=Pipeline(Schedule.ONE_F_ONE_B, vpp=2)),
     ("megatron",), ("vpp=2",)),
    (plan(zero_stage=2, offload=Offload(params=True)), ("deepspeed", "torchtitan"),
     ("zero_stage=3", "zero_stage 3")),
    (plan("llama-3-8b", zero_stage=1), ("torchtitan",), ("zero_stage=1", "ZeRO stage 1")),
    (plan("llama-3-8b", zero_stage=3, offload=Offload(optimizer=True)), ("torchtitan",),
     ("together",)),
    (plan("llama-3-8b", 16, parallel=Parallel(dp=1, tp=16)), ("megatron", "deepspeed"),
     ("does not divide num_kv_heads",)),
]


@pytest.mark.parametrize("p, targets, markers", TWICE)
def test_a_refusal_says_each_reason_once(tmp_path: Path, capsys, p: Plan,
                                         targets: tuple[str, ...],
                                         markers: tuple[str, ...]) -> None:
    for target in targets:
        code, _, err = run(capsys, tmp_path, p, "--to", target)
        refused(code, err)
        assert sum(err.count(m) for m in markers) == 1, (target, err)


def test_every_refusal_lists_distinct_reasons() -> None:
    from autoplan.errors import ConfigError
    from autoplan.export.base import ExportOptions, export_plan
    from autoplan.export.registry import targets

    for p, _, _ in TWICE:
        for target in targets().values():
            try:
                export_plan(target, p, p.model_spec(), ExportOptions(gpus_per_node=8))
            except ConfigError as err:
                text = str(err).split("cannot express this plan: ", 1)[-1]
                reasons = text.rsplit("; ", 1)[0].split("; ")
                assert len(reasons) == len(set(reasons)), (target.name, reasons)


def test_a_plan_whose_profile_is_gone_names_its_field_and_warns_when_written_anyway(
        tmp_path: Path, capsys, caplog) -> None:
    """A plan searched on a profile file that no longer exists: the error names the plan's
    cluster.profile (not --cluster, which the user never gave) and the way on; with
    --gpus-per-node the job is written for that site's GPUs, with a warning that memory was not
    checked (a CPU profile's plan would have asked for CPUs)."""
    import shutil

    prof = tmp_path / "p.yaml"
    shutil.copy(Path(__file__).resolve().parents[3] / "profiles" / "cpu-gloo.yaml", prof)
    p = Plan(model="tiny", cluster=ClusterRef(str(prof), 2), parallel=Parallel(dp=2),
             batch=Batch(1, 8), precision=Precision.FP32)
    prof.unlink()
    code, _, err = run(capsys, tmp_path, p, "--to", "slurm")
    assert code == 2 and err.count("\n") == 1, err
    assert "cluster.profile: no such file" in err and "--gpus-per-node" in err
    assert "--cluster" not in err
    out = tmp_path / "job.sbatch"
    with caplog.at_level("WARNING"):
        code, _, err = run(capsys, tmp_path, p, "--to", "slurm", "--gpus-per-node", "4",
                           "--out", str(out))
    assert code == 0 and out.exists(), err
    assert any("memory not checked" in r.getMessage() for r in caplog.records)
