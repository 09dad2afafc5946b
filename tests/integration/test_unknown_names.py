"""An unknown --model preset or --cluster profile name is refused in one line (exit 2) that
suggests the name meant: the same but for case, the few names holding it, or a close one
(user test 34, finding 13: `--model llama-3-8B` and `--cluster h100` listed every name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.hardware import available_profiles
from autoplan.model_spec import PRESETS
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
    ("h100", "did you mean 'h100-96gb-500w' or 'h100-sxm-80gb'?"),
    ("H100-SXM-80GB", "did you mean 'h100-sxm-80gb'?"),
    ("v100", "did you mean 'v100-sxm2-32gb'?"),
    ("h100-sxm-80g", "did you mean 'h100-sxm-80gb'?"),
])
def test_a_cluster_name_gets_the_profile_it_likely_means(name: str, hint: str) -> None:
    assert name_hint(name, available_profiles()) == hint


@pytest.mark.parametrize("name", ["gpt3", "zzz", "", "8b"])
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
    ("--cluster", "h100", "h100-sxm-80gb", "did you mean 'h100-96gb-500w' or 'h100-sxm-80gb'?"),
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
