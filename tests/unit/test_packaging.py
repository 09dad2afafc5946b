"""The built wheel carries every subpackage, the profiles and the search spaces, and an
autoplan imported from it finds them from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "README.md", "autoplan", "profiles", "search_spaces")

if not (ROOT / "pyproject.toml").is_file():
    pytest.skip("needs the source checkout", allow_module_level=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the build inputs (the checkout gets no build/ folder)."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    (built,) = out.glob("autoplan-*.whl")
    return built


def test_wheel_holds_every_package_and_the_data(wheel) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("profiles", "search_spaces"):
        shipped = {p.name for p in (ROOT / folder).glob("*.yaml")}
        assert shipped, folder
        assert {f"autoplan/{folder}/{n}" for n in shipped} <= names, folder
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "autoplan").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    missing = sorted(p for p in sources if p not in names)
    assert not missing, ("add the package to [tool.setuptools] packages, or the data file's "
                         f"pattern to package-data, in pyproject.toml: {missing}")
    assert not any(n.startswith(("profiles/", "search_spaces/", "tests/")) for n in names)


def test_autoplan_from_the_wheel_finds_its_profiles_elsewhere(wheel, tmp_path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = ("import autoplan, json; from autoplan.hardware import load_profile; "
            "from autoplan.profile_files import available_profiles; "
            "from autoplan.search_space import load_space; "
            "print(json.dumps([autoplan.__file__, available_profiles(), "
            "load_profile('a100-sxm4-80gb').name, load_space('default').name]))")
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(tmp_path / "home")}
    env.pop("AUTOPLAN_PROFILES", None)
    env.pop("XDG_CONFIG_HOME", None)
    res = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    where, profiles, a100, space = json.loads(res.stdout)
    assert Path(where).is_relative_to(site)
    assert {"a100-sxm4-80gb", "cpu-gloo", "h100-sxm-80gb"} <= set(profiles)
    assert (a100, space) == ("a100-sxm4-80gb", "default")


def test_a_wheel_user_lists_and_copies_the_shipped_spaces(wheel, tmp_path) -> None:
    """`autoplan spaces` (user test 36, finding 4): the shipped spaces live inside the wheel,
    where a user finds none to copy without importlib.resources."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(tmp_path / "home")}
    env.pop("AUTOPLAN_SPACES", None)
    env.pop("XDG_CONFIG_HOME", None)

    def autoplan(*argv: str) -> str:
        code = f"import sys; from autoplan.commands import main; sys.exit(main({list(argv)!r}))"
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120, check=True).stdout

    rows = {r["name"]: r for r in json.loads(autoplan("spaces", "--format", "json"))}
    assert rows["default"]["source"] == "shipped"
    assert Path(rows["default"]["path"]).is_relative_to(site)
    assert autoplan("spaces", "default") == (ROOT / "search_spaces" / "default.yaml").read_text()
