"""`autoplan estimate --set parallel.*`: dp follows from the GPU count, and an infeasible plan
says so before its figures (issue #16 item 1)."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main

LLAMA = ["estimate", "--model", "llama-3-8b", "--cluster", "h100-sxm-80gb", "--num-gpus", "64",
         "--global-batch-size", "512"]


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("sets", "want"), [
    (["parallel.tp=2"], {"dp": 32, "tp": 2, "pp": 1, "cp": 1}),
    (["parallel.tp=2", "parallel.pp=4"], {"dp": 8, "tp": 2, "pp": 4, "cp": 1}),
    (["parallel.cp=2", "parallel.tp=8"], {"dp": 4, "tp": 8, "pp": 1, "cp": 2}),
    (["parallel.tp=2", "parallel.dp=16"], {"dp": 16, "tp": 2, "pp": 1, "cp": 1}),
    # a whole mapping is the same edit as its keys one by one
    (["parallel={tp: 2, pp: 4}"], {"dp": 8, "tp": 2, "pp": 4, "cp": 1}),
    (["parallel={tp: 2, dp: 16}"], {"dp": 16, "tp": 2, "pp": 1, "cp": 1}),
])
def test_dp_follows_the_gpu_count_unless_set(capsys, sets, want) -> None:
    argv = [*LLAMA, *[x for s in sets for x in ("--set", s)], "--format", "json"]
    code, out, err = run(capsys, argv)
    if want["dp"] * want["tp"] * want["pp"] * want["cp"] != 64:
        # an explicit dp that does not fill the cluster is the user's: judged, not replaced
        assert code == 2 and "dp * tp * pp * cp = 32" in err and out == ""
        return
    data = json.loads(out)
    assert code in (0, 3) and data["plan"]["parallel"] == want


def test_degrees_that_do_not_divide_the_world_exit_2_naming_them(capsys) -> None:
    code, out, err = run(capsys, [*LLAMA, "--set", "parallel.tp=3", "--format", "json"])
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "tp=3" in line and "num_gpus=64" in line


def test_a_plan_file_keeps_its_dp_until_the_world_changes(tmp_path, capsys) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("schema_version: 1\nmodel: llama-3-8b\n"
                    "cluster: {profile: h100-sxm-80gb, num_gpus: 16}\nparallel: {dp: 8, tp: 2}\n"
                    "batch: {micro_batch_size: 1, global_batch_size: 64}\n")
    _, out, _ = run(capsys, ["estimate", "--plan", str(plan), "--set", "zero_stage=1",
                             "--format", "json"])
    assert json.loads(out)["plan"]["parallel"]["dp"] == 8
    _, out, _ = run(capsys, ["estimate", "--plan", str(plan), "--set", "parallel.tp=4",
                             "--format", "json"])
    assert json.loads(out)["plan"]["parallel"] == {"dp": 4, "tp": 4, "pp": 1, "cp": 1}
    _, out, _ = run(capsys, ["estimate", "--plan", str(plan), "--set", "parallel={tp: 4}",
                             "--format", "json"])
    assert json.loads(out)["plan"]["parallel"] == {"dp": 4, "tp": 4, "pp": 1, "cp": 1}
    _, out, _ = run(capsys, ["estimate", "--plan", str(plan), "--num-gpus", "32",
                             "--format", "json"])
    assert json.loads(out)["plan"]["parallel"]["dp"] == 16


def test_an_infeasible_plan_prints_its_reasons_first_and_marks_the_figures(capsys) -> None:
    code, out, _ = run(capsys, ["estimate", "--model", "gpt3-175b", "--cluster",
                                "a100-sxm4-80gb", "--num-gpus", "8", "--global-batch-size", "8",
                                "--format", "table"])
    assert code == 3
    lines = out.splitlines()
    assert lines[0].startswith("infeasible")
    assert "short by" in lines[1]
    assert "INFEASIBLE" in out and "(infeasible plan) tokens/s" in out
    assert out.index("infeasible") < out.index("MFU")
