"""A space is named as the user gave it (user test 36, finding 3): a copy of default.yaml given
by path was reported as `space default`, a user file that shadows a shipped space said nothing,
and a user file whose `name:` differs from its file name was not warned about. Studies still
resume by the file's own `name:` and contents, whatever path the space is given by."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from autoplan.commands import main
from autoplan.search_space import _warn_inner_name, load_space
from autoplan.space_files import SPACES_DIR

SMALL = (SPACES_DIR / "small-cpu.yaml").read_text()
SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
          "--global-batch-size", "8", "--top", "1"]


@pytest.fixture
def user_spaces(tmp_path, monkeypatch):
    folder = tmp_path / "spaces"
    folder.mkdir()
    monkeypatch.setenv("AUTOPLAN_SPACES", str(folder))
    _warn_inner_name.cache_clear()
    return folder


def _copy(path, name: str, **changes) -> None:
    data = {**yaml.safe_load(SMALL), "name": name, **changes}
    path.write_text(yaml.safe_dump(data))


def test_a_copy_given_by_path_is_named_by_its_path_and_its_inner_name(tmp_path, monkeypatch,
                                                                      capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path / "dp_list.yaml", "small-cpu", parallel={"dp": [2, 4], "tp": [1, 2]})
    out = tmp_path / "out"
    assert main([*SEARCH, "--space", "dp_list.yaml", "--out", str(out), "--format",
                 "table"]) == 0
    header = " ".join(capsys.readouterr().out.split())  # the header wraps at the terminal
    assert "space dp_list.yaml (name: small-cpu)," in header
    assert json.loads((out / "summary.json").read_text())["space"] == \
        "dp_list.yaml (name: small-cpu)"
    _copy(tmp_path / "same.yaml", "same")
    assert load_space("same.yaml").name == "same.yaml"  # the path alone where they agree
    assert load_space("small-cpu").name == "small-cpu"


def test_a_user_file_named_otherwise_inside_is_warned_about_once(user_spaces, caplog) -> None:
    _copy(user_spaces / "other.yaml", "small-cpu")
    with caplog.at_level(logging.WARNING, logger="autoplan.search_space"):
        for _ in range(3):
            assert load_space("other").name == "other (name: small-cpu)"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1
    assert "space other (" in warned[0] and "says name: small-cpu" in warned[0]
    assert "set name: other in it" in warned[0]
    assert "rename" not in warned[0]  # small-cpu.yaml would shadow the shipped space


def test_a_user_file_that_shadows_a_shipped_space_is_said_in_the_header(user_spaces,
                                                                        capsys) -> None:
    _copy(user_spaces / "small-cpu.yaml", "small-cpu", zero_stage=[1])
    assert main([*SEARCH, "--space", "small-cpu", "--format", "json"]) == 0
    space = json.loads(capsys.readouterr().out)["space"]
    assert space == f"small-cpu (user file {user_spaces / 'small-cpu.yaml'}, not the shipped one)"


def test_a_study_resumes_whatever_path_gives_its_space(tmp_path, monkeypatch, capsys) -> None:
    """The fingerprint holds the file's `name:`, not the label: the same file by another path
    resumes the study (a label in it would refuse it as `space.name ... -> ...`)."""
    monkeypatch.chdir(tmp_path)
    _copy(tmp_path / "mine.yaml", "small-cpu")
    study = [*SEARCH, "--sampler", "random", "--trials", "4", "--storage",
             f"sqlite:///{tmp_path / 's.db'}", "--study", "s", "--format", "json"]
    assert main([*study, "--space", "mine.yaml"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*study, "--space", str(tmp_path / "mine.yaml"), "--trials", "6"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [(s["stored"], s["new"]) for s in again["studies"]] == [(4, 2)]
    assert first["space"] == "mine.yaml (name: small-cpu)"
    assert load_space("mine.yaml").summary() == load_space("small-cpu").summary()
