"""Named profiles and search spaces: the user's directory first, then the package's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan import resources
from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.hardware import PROFILES_DIR, load_profile
from autoplan.profile_files import available_profiles
from autoplan.search_space import load_space
from autoplan.space_files import SPACES_DIR, available_spaces

BUILTIN = yaml.safe_load((PROFILES_DIR / "a100-sxm4-80gb.yaml").read_text())


@pytest.fixture
def no_user_dirs(monkeypatch, tmp_path):
    """HOME, XDG_CONFIG_HOME and the AUTOPLAN_* variables pointed away from the real ones."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("XDG_CONFIG_HOME", "AUTOPLAN_PROFILES", "AUTOPLAN_SPACES"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _profile(directory: Path, name: str, description: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**BUILTIN, "name": name, "description": description}))
    return path


def test_package_data_when_no_user_directory_exists(no_user_dirs) -> None:
    assert (PROFILES_DIR / "a100-sxm4-80gb.yaml").is_file()
    assert (SPACES_DIR / "default.yaml").is_file()
    assert {"a100-sxm4-80gb", "cpu-gloo"} <= set(available_profiles())
    assert "__init__" not in available_profiles() and "default" in available_spaces()
    assert load_profile("a100-sxm4-80gb").description == BUILTIN.get("description", "")


def test_home_config_directory_is_searched_before_the_package(no_user_dirs) -> None:
    user = no_user_dirs / "home" / ".config" / "autoplan" / "profiles"
    _profile(user, "a100-sxm4-80gb", "my own copy")
    _profile(user, "my-machine", "measured here")
    assert resources.user_dir(resources.PROFILES) == user
    assert load_profile("a100-sxm4-80gb").description == "my own copy"
    assert load_profile("my-machine").description == "measured here"
    assert "my-machine" in available_profiles() and "h100-sxm-80gb" in available_profiles()


def test_environment_variables_name_the_user_directories(no_user_dirs, monkeypatch,
                                                         capsys) -> None:
    xdg = no_user_dirs / "xdg"
    _profile(xdg / "autoplan" / "profiles", "from-xdg", "xdg")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert load_profile("from-xdg").description == "xdg"
    env = no_user_dirs / "env-profiles"
    _profile(env, "from-env", "env")
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(env))
    assert load_profile("from-env").description == "env"
    with pytest.raises(ConfigError, match="from-xdg"):  # the variable replaces the XDG folder
        load_profile("from-xdg")
    assert main(["clusters", "--format", "json"]) == 0
    listed = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert {"from-env", "a100-sxm4-80gb"} <= listed

    spaces = no_user_dirs / "spaces"
    spaces.mkdir()
    (spaces / "mine.yaml").write_text(yaml.safe_dump({"name": "mine", "zero_stage": [0, 1]}))
    monkeypatch.setenv("AUTOPLAN_SPACES", str(spaces))
    assert load_space("mine").zero_stage == (0, 1)
    assert {"mine", "default"} <= set(available_spaces())


def test_names_never_leave_their_directories(no_user_dirs, monkeypatch) -> None:
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(no_user_dirs / "user"))
    for ref in ("../profiles/a100-sxm4-80gb", "/etc/passwd", ".hidden", ""):
        assert resources.find(resources.PROFILES, ref) is None
        with pytest.raises(ConfigError):
            load_profile(ref)
    for bad in ("../../x", "/abs/x", ".x", "a/b"):
        with pytest.raises(ConfigError, match="plain file name"):
            resources.safe_name(bad, "--name")
    assert resources.safe_name("my-machine_2.1", "--name") == "my-machine_2.1"


def test_new_files_go_to_the_checkout_only_from_inside_it(no_user_dirs, monkeypatch) -> None:
    root = resources.checkout_root()
    if root is None:  # an installed wheel: there is no checkout to write into
        monkeypatch.chdir(no_user_dirs)
        assert resources.default_write_dir(resources.PROFILES) == \
            resources.user_dir(resources.PROFILES)
        return
    monkeypatch.chdir(root / "tests")
    assert resources.default_write_dir(resources.PROFILES) == root / "profiles"
    monkeypatch.chdir(no_user_dirs)
    assert resources.default_write_dir(resources.PROFILES) == \
        no_user_dirs / "home" / ".config" / "autoplan" / "profiles"
