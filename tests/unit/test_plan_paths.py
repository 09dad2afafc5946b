"""A plan file's relative paths (`model`, `cluster.profile`) are read from the plan's folder by
every command (plan_files.plan_file_paths): `estimate --plan`, `train` and `export` read one
plan the same from any folder, and an error names the file looked for (user test 35,
finding 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_files import load_plan, plan_file_paths, save_plan
from autoplan.resources import PROFILES, find
from autoplan.yaml_io import dump_yaml, to_dict
from tests.cli_refusals import assert_refused

PLAN = ("schema_version: 1\nmodel: {model}\ncluster: {{profile: {profile}, num_gpus: 2}}\n"
        "parallel: {{dp: 2}}\nprecision: fp32\nattention: eager\n"
        "batch: {{micro_batch_size: 1, global_batch_size: 2}}\n")


def _site(folder: Path, profile: str = "site.yaml", model: str = "tiny") -> Path:
    """A plan in `folder` naming a copy of cpu-gloo beside it (its own name inside, as a
    user's edited copy has) and `model`."""
    folder.mkdir(parents=True, exist_ok=True)
    cpu = find(PROFILES, "cpu-gloo")
    assert cpu is not None
    data = yaml.safe_load(cpu.read_text())
    (folder / "site.yaml").write_text(yaml.safe_dump({**data, "name": "site"}))
    plan = folder / "plan.yaml"
    plan.write_text(PLAN.format(model=model, profile=profile))
    return plan


def test_relative_paths_are_made_absolute_from_the_plans_folder(tmp_path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mine").write_text("")  # a bare word the plan's folder holds: a file
    data = {"model": "models/m.yaml", "cluster": {"profile": "../site.yaml", "num_gpus": 2}}
    out = plan_file_paths(data, tmp_path / "p" / "plan.yaml")
    assert out["model"] == str(tmp_path / "p" / "models" / "m.yaml")
    assert out["cluster"] == {"profile": str(tmp_path / "site.yaml"), "num_gpus": 2}
    assert data["cluster"]["profile"] == "../site.yaml"  # the caller's mapping is left alone
    # names and absolute paths stay as written; a bare word is a file only where it lies
    for model, want in (("tiny", "tiny"), ("/abs/m.yaml", "/abs/m.yaml"),
                        ("tiny-typo", "tiny-typo"), ("mine", str(tmp_path / "p" / "mine"))):
        got = plan_file_paths({"model": model, "cluster": {"profile": "cpu-gloo"}},
                              tmp_path / "p" / "plan.yaml")
        assert got["model"] == want and got["cluster"]["profile"] == "cpu-gloo"
    # what is no string is the strict loader's to name
    assert plan_file_paths({"cluster": "x.yaml"}, tmp_path / "plan.yaml") == {"cluster": "x.yaml"}


def test_estimate_train_and_export_read_the_plan_the_same_from_another_folder(
        tmp_path, monkeypatch, capsys) -> None:
    """From another folder, estimate and train said `cluster.profile: no such file
    'site.yaml'` and export refused with a fix naming a file that did not exist."""
    plan = _site(tmp_path / "plans", model="model.yaml")
    (tmp_path / "plans" / "model.yaml").write_text(
        dump_yaml(to_dict(PRESETS["tiny"].replace(name="mine"))))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["estimate", "--plan", "../plans/plan.yaml", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    site = str(tmp_path / "plans" / "site.yaml")
    assert data["profile"] == site and data["model"] == "mine"
    assert load_plan("../plans/plan.yaml").cluster.profile == site  # train's reader
    out = elsewhere / "job.sh"
    assert main(["export", "../plans/plan.yaml", "--to", "torchrun", "--out", str(out)]) == 0
    assert f"< {site})" in out.read_text()
    assert plan.read_text().count("site.yaml") == 1  # the plan file is left as written


@pytest.mark.parametrize("argv", [["estimate", "--plan"], ["train"],
                                  ["export", "--to", "torchrun"]])
def test_a_missing_relative_file_is_named_where_it_was_looked_for(tmp_path, monkeypatch,
                                                                  capsys, argv) -> None:
    _site(tmp_path / "plans", profile="gone.yaml")
    monkeypatch.chdir(tmp_path)
    where = argv[:2] if argv[0] == "estimate" else argv[:1]
    assert_refused(capsys, [*where, "plans/plan.yaml", *argv[len(where):]],
                   "cluster.profile: ", str(tmp_path / "plans" / "gone.yaml"))


def test_a_flag_path_is_read_from_the_working_folder(tmp_path, monkeypatch, capsys) -> None:
    """--cluster is the command line's: from where the command runs, not the plan's folder."""
    _site(tmp_path / "plans")
    (tmp_path / "here.yaml").write_text((tmp_path / "plans" / "site.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["estimate", "--plan", "plans/plan.yaml", "--cluster", "here.yaml",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "here.yaml"


def test_a_plan_with_relative_paths_saves_as_written_and_reloads(tmp_path) -> None:
    """save_plan reloads and compares: a relative path reloads read from the plan's folder."""
    _site(tmp_path)
    plan = Plan(model="tiny", cluster=ClusterRef("site.yaml", 2), parallel=Parallel(dp=2),
                batch=Batch(micro_batch_size=1, global_batch_size=2))
    written = save_plan(plan, tmp_path / "saved.yaml", overwrite=True)
    assert yaml.safe_load(written.read_text())["cluster"]["profile"] == "site.yaml"
    assert load_plan(written).cluster.profile == str(tmp_path / "site.yaml")


def test_train_runs_a_plan_naming_its_profile_beside_it_and_names_that_profile(
        tmp_path) -> None:
    """train read the plan's `site.yaml` from the working folder; its summary now names the
    profile its prediction was priced on (`predicted.profile`), as estimate does."""
    plan = _site(tmp_path / "plans")
    plan.write_text(plan.read_text().replace("num_gpus: 2", "num_gpus: 1")
                    .replace("dp: 2", "dp: 1").replace("global_batch_size: 2",
                                                       "global_batch_size: 1"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(  # torchrun's ranks: a process of its own, as a user runs it
        [sys.executable, "-m", "autoplan.commands", "train", "../plans/plan.yaml", "--steps",
         "1", "--format", "json"], cwd=elsewhere, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["predicted"]["profile"] == str(tmp_path / "plans" / "site.yaml")
    assert summary["predicted"]["runtime"] == "autoplan-cpu"


@pytest.mark.parametrize("predicted", [True, False])
def test_the_train_table_names_the_profile_it_priced(monkeypatch, predicted) -> None:
    import io

    from rich.console import Console

    from autoplan.runtime import summary as run_summary
    from autoplan.runtime.launch import render, with_profile
    from autoplan.runtime.metrics import StepMetrics
    from autoplan.runtime.summary import summarize
    from tests.dist.parity import make_plan

    pred = {"step_time_s": 0.05, "tokens_per_s": 1e4, "memory_bytes": 1e6,
            "runtime": "autoplan-cpu", "error_band": 0.25}
    monkeypatch.setattr(run_summary, "predicted",
                        lambda plan: (dict(pred), None) if predicted else (None, "no model"))
    plan = make_plan()
    plan = plan.replace(cluster=ClusterRef("/site/my-h100.yaml", plan.cluster.num_gpus))
    summary = with_profile(summarize([StepMetrics(s, 5.0, 0.1, 1e4, 1 << 20, 0.5)
                                      for s in (1, 2)], plan), plan)
    console = Console(file=io.StringIO(), width=200)
    render(console, summary, plan.cluster.profile)
    last = console.file.getvalue().splitlines()[-1]
    if predicted:
        assert summary["predicted"]["profile"] == "/site/my-h100.yaml"
        assert last == "predicted for runtime autoplan-cpu on profile /site/my-h100.yaml"
    else:
        assert summary["predicted"] is None
        assert last == "profile /site/my-h100.yaml (no prediction)"


def test_a_home_folder_path_in_a_plan_is_expanded(tmp_path, monkeypatch) -> None:
    """`model: ~/m.yaml` in a plan was kept as written and read as ./~/m.yaml wherever a
    command ran (no shell expands a YAML value; review of ded00e9)."""
    from autoplan.plan_files import plan_file_paths

    monkeypatch.setenv("HOME", str(tmp_path))
    data = {"model": "~/models/m.yaml", "cluster": {"profile": "~/p.yaml", "num_gpus": 1}}
    out = plan_file_paths(data, tmp_path / "plans" / "plan.yaml")
    assert out["model"] == str(tmp_path / "models" / "m.yaml")
    assert out["cluster"]["profile"] == str(tmp_path / "p.yaml")
