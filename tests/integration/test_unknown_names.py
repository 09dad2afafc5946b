"""An unknown --model preset, --cluster profile or --space name is refused in one line (exit 2)
that suggests the name meant: the same but for case, the few names holding every token typed
(the likelier first), or a close one (user test 34, finding 13: `--model llama-3-8B` and
`--cluster h100` listed every name; user test 38, N3: `a100-80gb` got only a100-80gb-opa,
`--space defualt` no suggestion)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.model_spec import PRESETS
from autoplan.profile_files import available_profiles
from autoplan.yaml_io import name_hint


@pytest.mark.parametrize("name,hint", [
    ("llama-3-8B", "did you mean 'llama-3-8b'?"),  # case alone
    ("Mixtral-8X7B", "did you mean 'mixtral-8x7b'?"),
    ("mixtral", "did you mean 'mixtral-8x7b' or 'mixtral-8x22b'?"),  # the names holding it
    ("llama3-8b", "did you mean 'llama-3-8b'?"),  # close (difflib), without case
    ("LLAMA3.1-70B", "did you mean 'llama-3.1-70b'?"),
])
def test_a_model_name_gets_the_preset_it_likely_means(name: str, hint: str) -> None:
    assert name_hint(name, PRESETS) == hint


@pytest.mark.parametrize("name,hint", [
    ("h100", "did you mean 'h100-sxm-80gb' or 'h100-96gb-500w'?"),  # the closer spelling first
    # every token typed, qualifier between them (sxm4) before a variant after them (opa)
    ("a100-80gb", "did you mean 'a100-sxm4-80gb' or 'a100-80gb-opa'?"),
    ("A100-80", "did you mean 'a100-sxm4-80gb' or 'a100-80gb-opa'?"),
    ("sxm-80gb", "did you mean 'h100-sxm-80gb' or 'h800-sxm-80gb' or 'a100-sxm4-80gb'?"),
    ("H100-SXM-80GB", "did you mean 'h100-sxm-80gb'?"),
    ("v100", "did you mean 'v100-sxm2-32gb'?"),
    ("h100-sxm-80g", "did you mean 'h100-sxm-80gb'?"),
])
def test_a_cluster_name_gets_the_profile_it_likely_means(name: str, hint: str) -> None:
    assert name_hint(name, available_profiles()) == hint


@pytest.mark.parametrize("name", ["gpt3", "zzz", "", "8b", "llama-3"])
def test_no_hint_where_no_name_or_too_many_are_near(name: str) -> None:
    """`gpt3` is in eight presets: naming one of them would be a guess."""
    assert name_hint(name, PRESETS) is None


def test_names_keep_their_own_case() -> None:
    assert name_hint("my-box", ["My-Box", "other"]) == "did you mean 'My-Box'?"
    assert name_hint("my-bx", ["My-Box", "other"]) == "did you mean 'My-Box'?"


GPUS = ["--num-gpus", "8"]
COMMANDS = {
    "search": ["search", "--global-batch-size", "8", *GPUS],
    "estimate": ["estimate", *GPUS],
    "tune": ["tune", "--num-gpus", "1", "--global-batch-size", "2", "--dry-run"],
    "import": ["import", "ds.json", "--from", "deepspeed", *GPUS],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("flag,given,good,hint", [
    ("--model", "llama-3-8B", "llama-3-8b", "did you mean 'llama-3-8b'?"),
    ("--cluster", "h100", "h100-sxm-80gb", "did you mean 'h100-sxm-80gb' or 'h100-96gb-500w'?"),
    ("--cluster", "a100-80gb", "a100-sxm4-80gb",
     "did you mean 'a100-sxm4-80gb' or 'a100-80gb-opa'?"),
])
def test_every_command_taking_the_flag_suggests_the_name(
        command: str, flag: str, given: str, good: str, hint: str, tmp_path: Path, capsys,
        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text('{"train_batch_size": 8}', encoding="utf-8")
    machine = "cpu-gloo" if command == "tune" else "h100-sxm-80gb"  # tune runs here
    names = {"--model": "llama-3-8b", "--cluster": machine, flag: given}
    argv = [*COMMANDS[command], "--model", names["--model"], "--cluster", names["--cluster"]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{flag}: unknown " in err and f"{given!r}; {hint} choose" in err
    assert "Traceback" not in err and good in err


def test_more_profiles_than_shown_holding_the_tokens_get_no_guess() -> None:
    """`80gb` is in four profiles: the list after the hint shows them."""
    assert name_hint("80gb", available_profiles()) is None


@pytest.mark.parametrize("command", ["search", "tune"])
@pytest.mark.parametrize("given,hint", [("defualt", "did you mean 'default'?"),
                                        ("small", "did you mean 'small-cpu'?")])
def test_a_space_name_gets_the_space_it_likely_means(command: str, given: str, hint: str,
                                                     capsys) -> None:
    argv = [command, "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
            "--global-batch-size", "2", "--space", given, *(["--dry-run"] * (command == "tune"))]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert len(err.strip().splitlines()) == 1 and not captured.out, err
    assert f"--space: no search space named {given!r}; {hint} choose one of default," in err
