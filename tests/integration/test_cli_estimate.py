"""`autoplan estimate`, `models`, `clusters` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main

ROOT = Path(__file__).resolve().parents[2]
GPT3 = ["--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
        "--global-batch-size", "1536", "--micro-batch-size", "2", "--set", "parallel.dp=16",
        "--set", "parallel.tp=8", "--set", "parallel.pp=8", "--set", "sequence_parallel=true",
        "--set", "recompute.policy=selective", "--set", "zero_stage=1"]


def run_json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--format", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_estimate_json_has_the_contract_fields(capsys) -> None:
    code, data = run_json(capsys, ["estimate", *GPT3, "--train-tokens", "300e9"])
    assert code == 0 and data["feasible"] is True and data["reasons"] == []
    for part in ("params", "grads", "optimizer", "activations", "buffers", "total", "host_total"):
        assert part in data["memory"]
    for part in ("compute", "recompute", "tp_comm", "cp_comm", "pp_bubble", "pp_comm", "dp_comm",
                 "offload", "step"):
        assert part in data["time"]
    assert 0 < data["mfu"] < 1 and data["hfu"] >= data["mfu"]
    assert data["tokens_per_s"] == pytest.approx(1536 * 2048 / data["time"]["step"])
    assert 20 < data["days_to_train"] < 28
    parts = sum(v for k, v in data["time"].items() if k != "step")
    assert parts == pytest.approx(data["time"]["step"])


def test_estimate_reads_a_plan_file_and_set_overrides(tmp_path, capsys) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "schema_version: 1\nmodel: llama-3-8b\ncluster: {profile: h100-sxm-80gb, num_gpus: 8}\n"
        "parallel: {dp: 8}\nzero_stage: 2\nrecompute: {policy: full}\n"
        "batch: {micro_batch_size: 1, global_batch_size: 64}\n")
    code, data = run_json(capsys, ["estimate", "--plan", str(plan)])
    assert code == 0 and data["plan"]["parallel"]["dp"] == 8
    code, data2 = run_json(capsys, ["estimate", "--plan", str(plan), "--set", "zero_stage=3"])
    assert data2["memory"]["params"] < data["memory"]["params"]


def test_table_header_names_the_recomputed_modules(tmp_path, capsys) -> None:
    """The header says which modules a selective recompute re-runs, as search's tables do."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "schema_version: 1\nmodel: mixtral-8x7b\ncluster: {profile: h100-sxm-80gb, num_gpus: 64}\n"
        "parallel: {dp: 16, pp: 4, ep: 8}\nzero_stage: 1\n"
        "recompute: {policy: selective, modules: [layernorm, moe]}\n"
        "batch: {micro_batch_size: 1, global_batch_size: 256}\n")
    assert main(["estimate", "--plan", str(plan), "--runtime", "megatron",
                 "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "recompute=selective(layernorm+moe)" in out
    # every knob that changes the numbers is in the header: ep (and only where set), precision
    assert " cp=1 ep=8 sp=" in out and "precision=bf16" in out and "etp=" not in out
    plan.write_text(plan.read_text().replace("zero_stage: 1", "zero_stage: 1\nprecision: fp8\n"
                                             "offload: {optimizer: true}"))
    assert main(["estimate", "--plan", str(plan), "--runtime", "megatron",
                 "--format", "table"]) == 0
    words = " ".join(capsys.readouterr().out.split())  # the header wraps at the console width
    assert "precision=fp8 offload=optimizer" in words


def test_infeasible_plan_exits_3_with_shortfall(capsys) -> None:
    code, data = run_json(capsys, ["estimate", "--model", "gpt3-175b", "--cluster",
                                   "a100-sxm4-80gb", "--num-gpus", "8",
                                   "--global-batch-size", "8"])
    assert code == 3 and data["feasible"] is False
    assert data["memory"]["shortfall"] > 0
    assert any("short by" in r for r in data["reasons"])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "gpt-9", "--cluster", "a100-sxm4-80gb", "--num-gpus", "8"], "unknown model"),
        (["--model", "tiny", "--cluster", "tpu-v9", "--num-gpus", "8"], "unknown profile"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "0"], "--num-gpus"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--set", "parallel.tq=2"],
         "valid keys"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--set", "zero_stage=x"],
         "zero_stage"),
        (["--plan", "/nonexistent/plan.yaml"], "no such file"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--set", "oops"],
         "key=value"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--set", "cluster=7"],
         "cluster: got 7"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
          "--set", "parallel.dp=99999999999999999999"], "up to"),
        (["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--seq-len", "0"],
         "--seq-len"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys) -> None:
    try:
        code = main(["estimate", *argv, "--format", "json"])
    except SystemExit as stop:  # refused by argparse itself (its exit code for a bad flag is 2)
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_models_and_clusters_list_presets(capsys) -> None:
    code, models = run_json(capsys, ["models"])
    assert code == 0 and {"gpt3-175b", "llama-3-8b", "tiny"} <= {m["name"] for m in models}
    code, clusters = run_json(capsys, ["clusters"])
    assert {"v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm-80gb",
            "h200-sxm-141gb", "cpu-gloo"} <= {c["name"] for c in clusters}


def test_cli_shim_runs_as_a_process_and_renders_a_table() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "estimate", *GPT3,
                           "--format", "table"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "memory per GPU" in proc.stdout and "biggest cost" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "cli.py"), "estimate", "--model", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_planner_does_not_import_torch() -> None:
    code = "import sys, autoplan.commands as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_structurally_invalid_plan_is_exit_2_like_train(tmp_path: Path, capsys) -> None:
    """tp not dividing the heads is a mistake in the plan (exit 2, the rule's words, once),
    as `autoplan train` says; only a plan that does not fit or misses a target is exit 3."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema_version: 1\nmodel: tiny\ncluster: {profile: cpu-gloo, num_gpus: 3}\n"
                    "parallel: {tp: 3}\nbatch: {micro_batch_size: 1, global_batch_size: 3}\n"
                    "precision: fp32\n")
    needle = "parallel.tp=3 does not divide num_heads=4"
    for argv in (["estimate", "--plan", str(plan), "--format", "json"],
                 ["train", str(plan), "--nproc", "3", "--steps", "1"]):
        code = main(argv)
        out = capsys.readouterr()
        assert code == 2, (argv, out.err)
        assert out.err.count("\n") == 1 and out.err.count(needle) == 1, out.err
        assert out.out == ""


def test_estimate_says_which_way_its_band_leans(capsys) -> None:
    # GPT-3 175B on 1,024 A100 priced for Megatron: the megatron 3d large group's runs took
    # longer than priced; the table says so beside the band, the JSON carries it
    code, data = run_json(capsys, ["estimate", *GPT3, "--runtime", "megatron"])
    assert code == 0 and data["error_bias"] > 0.005
    assert main(["estimate", *GPT3, "--runtime", "megatron", "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"± {data['error_band']:.0%} (validation error of runs of this kind, which took "
            f"{data['error_bias']:.0%} longer than priced on average)") in text


def test_estimate_of_a_searched_plan_prices_the_runtime_search_priced(tmp_path, capsys) -> None:
    """A plan `search --runtime megatron` wrote records that runtime; `estimate --plan` priced it
    as autoplan's own and printed a step time the search's table never showed."""
    out = tmp_path / "s"
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
                 "8", "--global-batch-size", "64", "--runtime", "megatron", "--out", str(out),
                 "--format", "json"]) == 0
    capsys.readouterr()
    searched = out / "plan.yaml"
    code, data = run_json(capsys, ["estimate", "--plan", str(searched)])
    assert code == 0 and data["runtime"] == "megatron"
    recorded = yaml.safe_load(searched.read_text())["predicted"]["step_time_s"]
    assert data["time"]["step"] == pytest.approx(recorded)
    _, own = run_json(capsys, ["estimate", "--plan", str(searched), "--runtime", "autoplan"])
    assert own["runtime"] == "autoplan-cuda" and own["time"]["step"] != pytest.approx(recorded)


def test_a_plan_priced_as_autoplans_own_runtime_follows_the_device(tmp_path, capsys, caplog) -> None:
    """A plan searched on the CPU profile records autoplan-cpu; estimated on a GPU profile it is
    priced as autoplan's CUDA runtime, not as the CPU one. A recorded name that is no preset (a
    traits file's) is priced as autoplan's own, and said."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema_version: 1\nmodel: gpt3-1.3b\n"
                    "cluster: {profile: a100-sxm4-80gb, num_gpus: 8}\nparallel: {dp: 8}\n"
                    "batch: {micro_batch_size: 1, global_batch_size: 64}\n"
                    "predicted: {runtime: autoplan-cpu}\n")
    _, data = run_json(capsys, ["estimate", "--plan", str(plan)])
    assert data["runtime"] == "autoplan-cuda"
    plan.write_text(plan.read_text().replace("autoplan-cpu", "my-traits"))
    with caplog.at_level("WARNING"):
        _, data = run_json(capsys, ["estimate", "--plan", str(plan)])
    assert data["runtime"] == "autoplan-cuda" and "'my-traits', which is no preset" in caplog.text
