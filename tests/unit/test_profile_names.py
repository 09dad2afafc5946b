"""A profile is found by its file name (user test 35, finding 4): `profile --out X.yaml` writes
`name: X`; a profile found by name whose `name:` differs warns once, naming both; and an
unknown name that a file gives as its own `name:` is pointed at that file."""

from __future__ import annotations

import argparse
import logging

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.hardware import PROFILES_DIR, load_profile
from autoplan.profiler.cli import profile_name


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A profile folder holding my-h100.yaml that says `name: my-h100-roce`."""
    raw = yaml.safe_load((PROFILES_DIR / "h100-sxm-80gb.yaml").read_text())
    (tmp_path / "my-h100.yaml").write_text(yaml.safe_dump({**raw, "name": "my-h100-roce"}))
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    return tmp_path


def test_the_inner_name_is_pointed_at_its_file(user_dir) -> None:
    with pytest.raises(ConfigError) as err:
        load_profile("my-h100-roce")
    assert str(err.value).startswith(
        f"--cluster: unknown profile 'my-h100-roce'; did you mean 'my-h100'? "
        f"{user_dir / 'my-h100.yaml'} says name: my-h100-roce, but a profile is found by its "
        "file name;")


def test_a_name_found_by_file_name_warns_once_naming_both(user_dir, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.hardware"):
        for _ in range(3):
            assert load_profile("my-h100").name == "my-h100-roce"
    [record] = [r for r in caplog.records if "says name" in r.getMessage()]
    msg = record.getMessage()
    assert "profile my-h100 (" in msg and "says name: my-h100-roce" in msg
    assert "--cluster takes my-h100, not my-h100-roce" in msg


def test_a_matching_name_or_a_path_does_not_warn(user_dir, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.hardware"):
        load_profile("cpu-gloo")
        load_profile(str(user_dir / "my-h100.yaml"))  # found by its path: the name finds nothing
    assert not [r for r in caplog.records if "says name" in r.getMessage()]


@pytest.mark.parametrize(("name", "out", "want"), [
    (None, "runs/my-machine.yaml", "my-machine"),  # wrote `name: cpu-measured`
    ("my-machine", "my-machine.yaml", "my-machine"),
    ("mine", None, "mine"),
    (None, None, "cpu-measured"),
])
def test_profile_names_the_profile_by_its_file(name, out, want) -> None:
    assert profile_name(argparse.Namespace(name=name, out=out), "cpu-measured") == want


def test_a_name_that_is_not_the_out_file_name_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        profile_name(argparse.Namespace(name="mine", out="p/other.yaml"), "cpu-measured")
    assert str(err.value) == ("--name: 'mine' differs from --out's file name 'other', the name "
                              "`--cluster` finds the profile by; leave --name out (the profile "
                              "is named other), or write --out p/mine.yaml")


@pytest.mark.parametrize(("out", "hint"), [
    ("v1.2.yaml", "v1-2.yaml"), ("my box.yaml", "my-box.yaml"), ("box.yml", "box.yaml")])
def test_an_out_file_no_cluster_name_finds_is_warned_about(out, hint, caplog) -> None:
    """`profile --out v1.2.yaml` wrote name: v1.2, which --cluster v1.2 then could not find
    (a name has no '.'); 'my box' and a .yml file neither (review of 29bc235). Written all the
    same, found by path; the warning says so and names a file name that works."""
    with caplog.at_level(logging.WARNING):
        assert profile_name(argparse.Namespace(name=None, out=out), "x") == out.rsplit(".", 1)[0]
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"--out {out}: --cluster cannot find this profile by name")
    assert said.endswith(f"give --cluster its path, or write it as e.g. {hint}")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        profile_name(argparse.Namespace(name=None, out="good-name_2.yaml"), "x")
    assert not caplog.records


def test_an_unknown_name_is_offered_only_profiles(user_dir) -> None:
    """The "choose one of" list held the stems of the plans, model specs and traits files kept
    in a profile folder, which --cluster then refused (review finding H1.3)."""
    (user_dir / "a-plan.yaml").write_text("model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 1}"
                                          "\nbatch: {micro_batch_size: 1, global_batch_size: 1}\n")
    (user_dir / "a-model.yaml").write_text("name: my-h100-x\nnum_layers: 2\nhidden_size: 64\n")
    (user_dir / "r1.yaml").write_text("name: r1\nbase: megatron\nfused_swiglu: false\n")
    (user_dir / "broken.yaml").write_text("name: broken\ndevice: 3\n")  # a profile, if broken
    with pytest.raises(ConfigError) as err:
        load_profile("nosuch")
    choices = str(err.value).split("choose one of ", 1)[1].split(" or a path")[0].split(", ")
    assert "my-h100" in choices and "cpu-gloo" in choices and "broken" in choices
    assert not {"a-plan", "a-model", "r1"} & set(choices), choices
    with pytest.raises(ConfigError) as err:  # a model spec's name: points at no profile file
        load_profile("my-h100-x")
    assert "did you mean 'a-model'" not in str(err.value), str(err.value)
    with pytest.raises(ConfigError) as err:
        load_profile("a-plan")  # a stray is still found by name, and refused as no profile
    assert "a-plan.yaml" in str(err.value)
