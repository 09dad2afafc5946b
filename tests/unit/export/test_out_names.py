"""Exports name the file the user chose in their run instructions (issue #16 item 7)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import save_plan

from .cases import CASES


def export(tmp_path: Path, case: str, target: str, out: Path, *extra: str) -> int:
    plan = save_plan(CASES[case][0], tmp_path / "plan.yaml", overwrite=True)
    return main(["export", str(plan), "--to", target, "--out", str(out), *extra])


TITAN = [k for k, (_, targets) in CASES.items() if "torchtitan" in targets]


def titan_case() -> str:
    return TITAN[0]


@pytest.mark.parametrize("case", TITAN)
def test_torchtitan_python_names_its_own_module(tmp_path: Path, capsys, case: str) -> None:
    out = tmp_path / "x" / "my_job.py"
    out.parent.mkdir()
    # the names are the subject, not whether the fixture fits
    assert export(tmp_path, case, "torchtitan", out, "--no-memory-check") == 0
    text = out.read_text()
    assert f"PYTHONPATH={out.parent}" in text and "--module my_job " in text
    assert "autoplan_torchtitan" not in text
    tree = ast.parse(text)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert imported <= used, f"unused imports: {imported - used}"
    assert f"wrote {out}" in capsys.readouterr().err


def test_torchtitan_refuses_a_name_python_cannot_import(tmp_path: Path, capsys) -> None:
    out = tmp_path / "my-job.py"
    assert export(tmp_path, titan_case(), "torchtitan", out) == 2
    assert not out.exists() and "my_job.py" in capsys.readouterr().err


def test_torchtitan_toml_names_its_own_file(tmp_path: Path) -> None:
    out = tmp_path / "run.toml"
    assert export(tmp_path, titan_case(), "torchtitan", out, "--torchtitan-format", "toml") == 0
    assert f"--job.config_file {out}" in out.read_text()


def test_a_toml_out_writes_the_toml_job(tmp_path: Path, capsys) -> None:
    """`--out job.toml` was refused ("it must be NAME.py ... or export --torchtitan-format
    toml"): the suffix picks the TOML form, priced as the release that reads it."""
    out = tmp_path / "job.toml"
    assert export(tmp_path, titan_case(), "torchtitan", out) == 0
    assert out.read_text().startswith("# torchtitan (<= 0.2.2) job for model ")
    assert "priced for torchtitan:" in capsys.readouterr().err


def test_a_toml_out_with_the_python_form_asked_for_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "job.toml"
    assert export(tmp_path, titan_case(), "torchtitan", out, "--torchtitan-format",
                  "python") == 2
    err = capsys.readouterr().err
    assert "name it e.g. " in err and "job.py, or leave --torchtitan-format python out (a " \
        ".toml --out writes the TOML job)" in err and not out.exists()


@pytest.mark.parametrize("name", ["train_mega.sh", "jobs/m.sh"])
def test_megatron_script_names_itself(tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    out.parent.mkdir(exist_ok=True)
    assert export(tmp_path, "megatron-3d", "megatron", out) == 0
    assert f"# bash {out} " in out.read_text()


@pytest.mark.parametrize("fmt, runtime", [("python", "torchtitan-0.3"), ("toml", "torchtitan")])
def test_torchtitan_is_priced_as_the_release_its_format_runs(tmp_path: Path, capsys, fmt: str,
                                                            runtime: str) -> None:
    """The Python config is torchtitan 0.3.0's (grouped K/V heads, all-gather CP, no early
    stop), the TOML 0.2.2's: the price line names the traits it used."""
    out = tmp_path / ("job.py" if fmt == "python" else "job.toml")
    assert export(tmp_path, titan_case(), "torchtitan", out, "--torchtitan-format", fmt) == 0
    assert f"priced for {runtime}:" in capsys.readouterr().err


def test_a_torchtitan_file_name_is_refused_as_out_not_as_the_plan(tmp_path: Path,
                                                                  capsys) -> None:
    """`--out x.out` was listed among the plan's reasons, ending "change the plan or pick
    another target": the file name is what is wrong."""
    out = tmp_path / "a_torchtitan.out"
    assert export(tmp_path, titan_case(), "torchtitan", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoplan export: error: --out: got ") and len(err.splitlines()) == 1
    assert "cannot express this plan" not in err and "a_torchtitan.py" in err
