"""`import --from deepspeed` of the JSON alone, which records no tensor or pipeline
parallelism: refused naming the launch when the launch `export --to deepspeed` wrote beside it
splits the model, said on stderr when nothing tells the degrees, silent when the JSON is the
whole plan. It never quietly imports a 3D run as data parallelism over fewer GPUs."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.export.importers import import_deepspeed
from autoplan.plan import Parallel
from autoplan.plan_files import save_plan
from tests.cli_refusals import assert_refused

from .cases import FULL, plan

THREE_D = plan("llama-3-8b", 32, parallel=Parallel(dp=8, tp=2, pp=2), sequence_parallel=True,
               zero_stage=1, recompute=FULL)
"""32 GPUs, the model split 4 ways: the JSON's batch keys say dp 8."""
PLAIN = plan("gpt3-1.3b", 16, zero_stage=1)
CLUSTER = "h100-sxm-80gb"
UNSAID = "records no tensor or pipeline parallelism and no --num-gpus was given"


def _export(tmp_path: Path, p, *extra: str) -> Path:
    plan_file = tmp_path / "plan.yaml"
    save_plan(p, plan_file)
    out = tmp_path / "ds.json"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(out),
                 "--no-memory-check", *extra]) == 0
    assert out.with_name("ds.launch.sh").is_file()
    return out


def _import(path: Path, *extra: str) -> list[str]:
    return ["import", str(path), "--from", "deepspeed", "--model", "llama-3-8b", "--cluster",
            CLUSTER, *extra]


def test_the_json_of_a_3d_export_is_refused_naming_its_launch(tmp_path, capsys):
    ds = _export(tmp_path, THREE_D)
    capsys.readouterr()
    launch = ds.with_name("ds.launch.sh")
    for extra in ((), ("--num-gpus", "32")):  # with --num-gpus too: the launch is named
        assert_refused(capsys, _import(ds, *extra), f"{ds}: records no tensor or pipeline "
                       f"parallelism, but {launch}, beside it, runs it with tp=2 pp=2",
                       f"import {launch} instead, or pass --set parallel.tp=2 "
                       "--set parallel.pp=2")
    # half the degrees is refused too: it would price 16 of the 32 GPUs
    assert_refused(capsys, _import(ds, "--set", "parallel.tp=2"),
                   "read with --set as tp=2 pp=1, but", "runs it with tp=2 pp=2")


def test_the_launchs_degrees_given_with_set_import_the_plan(tmp_path):
    ds = _export(tmp_path, THREE_D)
    back = import_deepspeed(ds, model="llama-3-8b", cluster=CLUSTER, num_gpus=None,
                            assignments=["parallel.tp=2", "parallel.pp=2"])
    from_launch = import_deepspeed(ds.with_name("ds.launch.sh"), model="llama-3-8b",
                                   cluster=CLUSTER, num_gpus=None)
    assert from_launch == THREE_D
    # the JSON alone does not hold sequence parallelism (the launch's flag), the rest it does
    assert back == THREE_D.replace(sequence_parallel=False)


def test_the_names_export_gives_without_out_are_found_too(tmp_path, capsys):
    """Exported to stdout, the files are ds_config.json and launch.sh."""
    ds = _export(tmp_path, THREE_D)
    ds.rename(tmp_path / "ds_config.json")
    launch = tmp_path / "launch.sh"
    launch.write_text(ds.with_name("ds.launch.sh").read_text().replace("ds.json",
                                                                        "ds_config.json"))
    ds.with_name("ds.launch.sh").unlink()
    capsys.readouterr()
    assert_refused(capsys, _import(tmp_path / "ds_config.json"), f"but {launch}, beside it")


def test_a_lone_json_says_its_degrees_were_not_recoverable(tmp_path, caplog):
    ds = _export(tmp_path, THREE_D)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ds, alone / "ds.json")
    with caplog.at_level(logging.WARNING):
        back = import_deepspeed(alone / "ds.json", model="llama-3-8b", cluster=CLUSTER,
                                num_gpus=None)
    assert back.parallel == Parallel(dp=8) and back.world_size == 8
    [said] = [r.getMessage() for r in caplog.records if UNSAID in r.getMessage()]
    assert "read as data parallelism over 8 GPUs" in said
    assert "import its launch script, or pass --num-gpus and --set parallel.tp=N" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # --num-gpus fixes it: 8 GPUs, all data-parallel
        import_deepspeed(alone / "ds.json", model="llama-3-8b", cluster=CLUSTER, num_gpus=8)
    assert not [r for r in caplog.records if UNSAID in r.getMessage()]


def test_the_json_of_a_data_parallel_export_imports_silently(tmp_path, caplog):
    """Its launch beside it says tp = pp = 1: the JSON is the whole plan."""
    ds = _export(tmp_path, PLAIN)
    with caplog.at_level(logging.WARNING):
        back = import_deepspeed(ds, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=None)
    assert back == PLAIN
    assert caplog.records == []


@pytest.mark.parametrize("beside", ["ds.launch.sh", "launch.sh"])
def test_a_launch_beside_that_names_another_json_is_not_taken_for_this_ones(tmp_path, caplog,
                                                                            beside):
    ds = _export(tmp_path, THREE_D)
    launch = ds.with_name("ds.launch.sh")
    text = launch.read_text()
    launch.unlink()
    (tmp_path / beside).write_text(text.replace("ds.json", "other.json"))
    with caplog.at_level(logging.WARNING):  # read alone, and said so: no launch names it
        back = import_deepspeed(ds, model="llama-3-8b", cluster=CLUSTER, num_gpus=None)
    assert back.world_size == 8
    assert [r for r in caplog.records if UNSAID in r.getMessage()]


def test_a_split_the_data_parallel_launch_beside_does_not_make_is_refused(tmp_path, capsys):
    """--set parallel.tp=2 on the JSON of a data-parallel export was read as tp=2 over 32 GPUs
    while the launch beside it starts 16 with no split: the contradiction is refused, as a
    3D launch's is, and the launch's own degrees still import."""
    ds = _export(tmp_path, PLAIN)
    launch = ds.with_name("ds.launch.sh")
    capsys.readouterr()
    assert_refused(capsys, _import(ds, "--set", "parallel.tp=2"),
                   f"{ds}: read with --set as tp=2 pp=1, but {launch}, beside it, runs it with "
                   "tp=1 pp=1", "drop --set parallel.tp (that run splits nothing)")
    back = import_deepspeed(ds, model="gpt3-1.3b", cluster=CLUSTER, num_gpus=None,
                            assignments=["parallel.tp=1"])
    assert back == PLAIN
