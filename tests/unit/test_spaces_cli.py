"""`autoplan spaces` (user test 36, finding 4): lists the spaces `--space` takes by name with
where each comes from, and prints one's YAML as written, so that `> my.yaml` is a copy that
`search --space my.yaml` reads."""

from __future__ import annotations

import json

import pytest
import yaml

from autoplan.commands import main
from autoplan.search_space import load_space
from autoplan.space_files import SPACES_DIR, available_spaces
from tests.cli_refusals import assert_refused


@pytest.fixture
def user_spaces(tmp_path, monkeypatch):
    folder = tmp_path / "spaces"
    folder.mkdir()
    monkeypatch.setenv("AUTOPLAN_SPACES", str(folder))
    return folder


def _listed(capsys) -> tuple[dict[str, dict], str]:
    assert main(["spaces", "--format", "json"]) == 0
    out = capsys.readouterr()
    return {row["name"]: row for row in json.loads(out.out)}, out.err


def test_every_space_is_listed_with_its_source_and_description(user_spaces, capsys) -> None:
    (user_spaces / "mine.yaml").write_text(yaml.safe_dump(
        {"name": "mine", "description": "two ZeRO stages", "zero_stage": [0, 1]}))
    (user_spaces / "default.yaml").write_text((SPACES_DIR / "default.yaml").read_text())
    (user_spaces / "broken.yaml").write_text("name: broken\ntp: [1]\n")
    rows, err = _listed(capsys)
    assert set(rows) == set(available_spaces()) - {"broken"}
    assert rows["mine"] == {"name": "mine", "source": "user", "path": str(user_spaces /
                            "mine.yaml"), "shadows_shipped": False,
                            "description": "two ZeRO stages"}
    assert rows["default"]["source"] == "user" and rows["default"]["shadows_shipped"]
    assert rows["small-cpu"]["source"] == "shipped" and not rows["small-cpu"]["shadows_shipped"]
    assert rows["small-cpu"]["path"] == str(SPACES_DIR / "small-cpu.yaml")
    # one broken file hides no others, and is said with the key that is wrong
    assert err.splitlines() == [line for line in err.splitlines() if "broken" in line]
    assert f"skipped {user_spaces / 'broken.yaml'}" in err and "tp: unknown key" in err


def test_the_table_says_which_user_space_shadows_a_shipped_one(user_spaces, capsys,
                                                               monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    (user_spaces / "default.yaml").write_text((SPACES_DIR / "default.yaml").read_text())
    assert main(["spaces", "--format", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "user, over shipped" in next(x for x in lines if x.strip().startswith("default"))
    assert " shipped " in next(x for x in lines if x.strip().startswith("small-cpu"))


def test_a_printed_space_is_the_file_as_written_and_loads_as_a_copy(tmp_path, user_spaces,
                                                                    capsys) -> None:
    assert main(["spaces", "default"]) == 0
    out = capsys.readouterr()
    assert out.out == (SPACES_DIR / "default.yaml").read_text()  # comments kept
    assert out.err == ""
    copy = tmp_path / "my.yaml"
    copy.write_text(out.out)
    assert load_space(copy).summary() == load_space("default").summary()


def test_a_shadowed_name_prints_the_users_file_and_shipped_the_other(user_spaces,
                                                                     capsys) -> None:
    mine = "schema_version: 1\nname: default\nzero_stage: [1]\n"
    (user_spaces / "default.yaml").write_text(mine)
    assert main(["spaces", "default"]) == 0
    out = capsys.readouterr()
    assert out.out == mine  # what `search --space default` reads
    assert "shadows the shipped one (--shipped prints that)" in out.err
    assert main(["spaces", "default", "--shipped"]) == 0
    assert capsys.readouterr().out == (SPACES_DIR / "default.yaml").read_text()


@pytest.mark.parametrize(("argv", "field", "says"), [
    (["spaces", "defalt"], "NAME", "did you mean 'default'?"),
    (["spaces", "mine", "--shipped"], "NAME", "no shipped search space named 'mine'"),
    (["spaces", "my.yaml"], "NAME", "got the path 'my.yaml'"),
    (["spaces", "default", "--format", "json"], "--format", "NAME prints the space's YAML"),
    (["spaces", "--shipped"], "--shipped", "given without NAME"),
    (["spaces", "broken"], "broken.yaml: tp", "unknown key"),
])
def test_bad_input_is_one_line_naming_the_field(user_spaces, capsys, argv, field,
                                                says) -> None:
    (user_spaces / "mine.yaml").write_text("name: mine\n")
    (user_spaces / "broken.yaml").write_text("name: broken\ntp: [1]\n")
    assert_refused(capsys, argv, field, says)
