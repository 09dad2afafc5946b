"""What a search reports when it spans several GPU types, GPU counts or global batches: the
nearest miss against its own type's memory, the published recipe priced on the winner's type and
batch, totals over every scored candidate (not only the rows a GPU-count range keeps), and the
batch range in the header, the JSON and a table column."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from autoplan.commands import build_parser, main
from autoplan.display import sig
from autoplan.hardware import load_profile
from autoplan.search import engine
from autoplan.search.baseline import score_baseline, why_lines
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.output import summary
from autoplan.search.rows import shown_rows
from autoplan.search.targets import MISS_KEYS

GIB = 2**30
# a handful of 175B layouts, the published recipe's (tp 8, pp 8, interleaved v3) among them
RECIPE_SPACE = {
    "schema_version": 1, "name": "recipe-small",
    "parallel": {"tp": [8], "pp": [8], "cp": [1]}, "sequence_parallel": [True],
    "pipeline": {"schedule": ["interleaved-1f1b"], "vpp": [3]}, "zero_stage": [1],
    "offload": {"optimizer": [False], "params": [False]},
    "recompute": {"policy": ["selective"], "num_layers": [None]},
    "micro_batch_size": [1], "precision": "bf16", "attention": ["flash"],
}


def run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def write_space(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_nearest_miss_of_several_types_is_judged_on_its_own_type(tmp_path: Path,
                                                                 capsys) -> None:
    """13B on one GPU fits neither an A100-40GB nor an H200 without offload; the nearest miss is
    on the H200, so it is told against the H200's 140 GiB, not the A100's 40, and named."""
    space = write_space(tmp_path, {
        "schema_version": 1, "name": "no-offload", "parallel": {"tp": [1], "pp": [1]},
        "zero_stage": [3], "offload": {"optimizer": [False], "params": [False]},
        "recompute": {"policy": ["full"], "num_layers": [None]}, "micro_batch_size": [1],
        "precision": "bf16", "attention": ["flash"]})
    job = ["search", "--model", "gpt3-13b", "--cluster", "a100-sxm4-40gb,h200-sxm-141gb",
           "--num-gpus", "1", "--global-batch-size", "8", "--space", space]
    code, out, err = run(job + ["--format", "json"], capsys)
    assert code == 3, err
    near = json.loads(out)["nearest"]
    assert near["reason"] == "out-of-memory"
    assert near["plan"]["cluster"] == {"profile": "h200-sxm-141gb", "num_gpus": 1}
    h200 = load_profile("h200-sxm-141gb").device.memory_bytes / GIB
    first = near["misses"][0]
    assert first.startswith("on 1 x h200-sxm-141gb, needs ")
    assert first.endswith(f" GiB of {h200:.1f} GiB per GPU") and h200 > 139
    needs = float(first.split("needs ")[1].split(" GiB")[0])
    # the exit-3 line names the type once, before the knobs, and the figure against its memory
    line = " ".join(err.split())
    assert "of 40 GiB" not in err and line.count("on 1 x h200-sxm-141gb") == 1
    assert f": needs {needs:.1f} GiB of {h200:.1f} GiB per GPU" in line
    assert needs > h200  # it misses the H200's own memory, not only the A100's
    code, table, _ = run(job + ["--format", "table"], capsys)
    assert code == 3 and ("nearest on 1 x h200-sxm-141gb (as estimate --set): parallel.dp=1 "
                         "parallel.tp=1") in " ".join(table.split())


def test_the_recipe_is_priced_on_the_winners_gpu_type(tmp_path: Path) -> None:
    """An H100 wins over an A100: the 'why this plan' recipe line prices the recipe on the
    H100, the step it prints is the H100's, and the A100's is nowhere."""
    space = write_space(tmp_path, RECIPE_SPACE)
    args = build_parser().parse_args([
        "search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb,h100-sxm-80gb",
        "--num-gpus", "64", "--global-batch-size", "128", "--space", space])
    result = run_search(build_request(args))
    assert result.best is not None
    assert result.scored.clusters[int(result.scored.cols["cluster"][result.best])] \
        == "h100-sxm-80gb"
    shown = shown_rows(result, summary(result, 3), 3)  # the rows --out keeps
    line = next(w for w in why_lines(result, {}, shown) if "recipe" in w)
    one = SimpleNamespace(request=build_request(build_parser().parse_args([
        *args_list(args), "--cluster", "h100-sxm-80gb"])))
    h100 = score_baseline(one, 64)
    a100 = score_baseline(SimpleNamespace(request=result.request), 64)  # the first type's
    assert h100 is not None and a100 is not None and h100.step_s < a100.step_s
    assert f"step {sig(h100.step_s)} s" in line and "on h100-sxm-80gb" in line
    assert f"step {sig(a100.step_s)} s" not in line
    gain = shown[0].row["tokens_per_s"] / h100.tokens_per_s - 1.0
    assert f"{gain:+.1%} tokens/s" in line


def args_list(args: Any) -> list[str]:
    """The argv of a parsed search, less --cluster (the recipe test reruns it on one type)."""
    return ["search", "--model", args.model, "--num-gpus", args.num_gpus,
            "--global-batch-size", args.global_batch_size, "--space", args.space]


def test_a_gpu_count_range_reports_every_scored_candidate(tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    """Scored count by count, a range keeps only each count's best rows; the totals in the
    JSON and the header are still those of every candidate (as `counts` has them), and how
    many rows were kept is said apart."""
    monkeypatch.setattr(engine, "KEEP_PER_COUNT", 5)
    data = yaml.safe_load(Path("search_spaces/small-cpu.yaml").read_text())
    space = write_space(tmp_path, data | {"name": "small-ranged", "max_enumerate": 20_000})
    job = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2..8",
           "--global-batch-size", "16", "--space", space]
    out = tmp_path / "out"
    code, text, err = run(job + ["--format", "json", "--out", str(out)], capsys)
    assert code == 0, err
    data = json.loads(text)
    counts = data["counts"]
    assert data["num_gpus"] == [2, 4, 8] and data["sampler"] == "exhaustive"
    scored = counts["feasible"] + sum(counts.get(k, 0) for k in MISS_KEYS)
    assert data["scored"] == scored and data["feasible_count"] == counts["feasible"]
    with gzip.open(out / "trials.csv.gz", "rt") as fh:
        rows = sum(1 for _ in fh) - 1
    assert data["kept"] == rows < scored  # the rows ranked and written, fewer than scored
    assert json.loads((out / "summary.json").read_text())["scored"] == scored
    code, table, _ = run(job + ["--format", "table"], capsys)
    header = " ".join(table[:table.index("candidates by outcome")].split())
    assert code == 0
    assert (f"{scored:,} scored, {counts['feasible']:,} feasible ({rows:,} kept: the best 5 "
            "per GPU count and its 5 nearest misses)") in header


def test_a_batch_range_is_shown_and_the_recipe_priced_at_the_winners_batch(
        tmp_path: Path, capsys) -> None:
    """--global-batch-size 64..256: the header and JSON give the range (the header with its
    tokens a step at seq_len 2048), the table a batch column whose first row is the winner's
    batch, and the recipe is priced at that batch."""
    space = write_space(tmp_path, RECIPE_SPACE)
    job = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "64",
           "--global-batch-size", "64..256", "--space", space, "--top", "3"]
    code, text, err = run(job + ["--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert data["global_batch_size"] == 64 and data["global_batch_range"] == [64, 256]
    assert data["global_batch_tokens"] == 64 * 2048  # the low end's, as global_batch_size
    picked = data["best"]["batch"]["global_batch_size"]
    assert picked != 64 and [r["gbs"] for r in data["top"]] != [picked] * 3
    code, table, _ = run(job + ["--format", "table"], capsys)
    assert code == 0 and "global batch 64..256 (131k..524k tokens)," in " ".join(table.split())
    lines = table.splitlines()
    head = next(j for j, ln in enumerate(lines) if ln.split()[:1] == ["#"])
    col = lines[head].split().index("gbs")
    assert [ln.split()[col] for ln in lines[head + 2:head + 5]] == \
        [str(r["gbs"]) for r in data["top"]]
    args = build_parser().parse_args(job)
    recipe = score_baseline(SimpleNamespace(request=build_request(args)), 64, picked)
    at_low = score_baseline(SimpleNamespace(request=build_request(args)), 64)
    assert recipe is not None and at_low is not None and recipe.step_s > at_low.step_s
    why = " ".join(table[table.index("against the Megatron"):].split())
    assert f"step {sig(recipe.step_s)} s" in why and f"at global batch {picked}:" in why


@pytest.mark.parametrize("gbs", ["64", "64..64"])
def test_one_batch_keeps_the_header_and_json_as_before(tmp_path: Path, capsys,
                                                       gbs: str) -> None:
    space = write_space(tmp_path, RECIPE_SPACE)
    code, text, err = run(["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb",
                           "--num-gpus", "64", "--global-batch-size", gbs, "--space", space,
                           "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert data["global_batch_size"] == 64 and "global_batch_range" not in data
    assert data["kept"] == data["scored"]


def test_the_report_page_names_the_batch_range_and_the_true_totals(tmp_path: Path,
                                                                  capsys) -> None:
    """report.html says what the table says: the batch range searched, and scored/feasible over
    every candidate with the kept rows apart."""
    pytest.importorskip("matplotlib")
    space = write_space(tmp_path, RECIPE_SPACE)
    job = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
           "64", "--global-batch-size", "64..256", "--space", space, "--top", "3",
           "--format", "json", "--report", str(tmp_path / "rep")]
    code, text, err = run(job, capsys)
    assert code == 0, err
    data = json.loads(text)
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "global batch 64..256:" in page and "64..256 sequences" in page
    assert f"{data['scored']:,} scored, {data['feasible_count']:,} feasible" in page
