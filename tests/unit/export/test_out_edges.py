"""`autoplan export --out` and `autoplan import --out` at their edges (issue #14 items 8, 16):
a directory, a path under a regular file, or an unwritable folder is exit 2 with one line and
nothing written; files written follow the umask (not mkstemp's 0600)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import load_plan, save_plan

from .cases import CASES


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def one_line_2(code: int, err: str) -> None:
    assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("force", [False, True])
def test_export_onto_a_directory_is_refused(plan_file: Path, tmp_path: Path, force: bool,
                                            capsys) -> None:
    target = tmp_path / "adir"
    (target / "inside").mkdir(parents=True)
    before = listing(tmp_path)
    code = main(["export", str(plan_file), "--to", "slurm", "--out", str(target)]
                + (["--force"] if force else []))
    err = capsys.readouterr().err
    one_line_2(code, err)
    assert "--out" in err and "is a directory" in err and listing(tmp_path) == before


def test_export_extra_file_onto_a_directory_writes_nothing(plan_file: Path, tmp_path: Path,
                                                          capsys) -> None:
    out = tmp_path / "ds.json"
    (tmp_path / "ds.launch.sh").mkdir()  # where the launch command would go
    before = listing(tmp_path)
    code = main(["export", str(plan_file), "--to", "deepspeed", "--out", str(out), "--force"])
    err = capsys.readouterr().err
    one_line_2(code, err)
    assert "is a directory" in err and listing(tmp_path) == before


@pytest.mark.parametrize("command", ["export", "import"])
def test_out_under_a_regular_file_is_refused(command: str, plan_file: Path, tmp_path: Path,
                                             capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    ds = tmp_path / "ds.json"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(ds)]) == 0
    capsys.readouterr()
    before = listing(tmp_path)
    argv = (["export", str(plan_file), "--to", "slurm"] if command == "export" else
            ["import", str(ds), "--from", "deepspeed", "--model", "gpt3-1.3b", "--cluster",
             "h100-sxm-80gb"])
    code = main([*argv, "--out", str(afile / "x" / "out.txt")])
    err = capsys.readouterr().err
    one_line_2(code, err)
    assert "which is a file" in err and listing(tmp_path) == before


def test_exported_and_imported_files_follow_the_umask(plan_file: Path, tmp_path: Path,
                                                      umask022: None, capsys) -> None:
    ds = tmp_path / "ds.json"
    assert main(["export", str(plan_file), "--to", "deepspeed", "--out", str(ds)]) == 0
    slurm = tmp_path / "job.sh"
    assert main(["export", str(plan_file), "--to", "slurm", "--out", str(slurm)]) == 0
    imported = tmp_path / "imported.yaml"
    assert main(["import", str(ds), "--from", "deepspeed", "--model", "gpt3-1.3b",
                 "--cluster", "h100-sxm-80gb", "--out", str(imported)]) == 0
    written = [ds, *tmp_path.glob("ds.*"), slurm, imported]
    assert len(written) >= 4
    assert {p.name: p.stat().st_mode & 0o777 for p in written} == \
        {p.name: 0o644 for p in written}
    assert load_plan(imported) == CASES["dp-zero1"][0]
