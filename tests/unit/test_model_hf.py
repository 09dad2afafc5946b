"""The guessed training sequence length of a Hugging Face config.json: said once per command,
and not at all when --seq-len gives it."""

from __future__ import annotations

import json
import logging

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.model_spec import load_model

LONG_CONTEXT = {  # a small Llama-style model with Qwen's 32768-token window and no rope_scaling
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
    "vocab_size": 256, "max_position_embeddings": 32768, "hidden_act": "silu",
}
TARGET = ["--cluster", "cpu-gloo", "--num-gpus", "2", "--global-batch-size", "2",
          "--format", "json"]


def _config(tmp_path, cfg=LONG_CONTEXT) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _cap_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "max_position_embeddings" in r.getMessage()]


def test_the_guess_is_said_once_per_file(tmp_path, caplog) -> None:
    path = _config(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert load_model(path).seq_len == 8192
        assert load_model(path, "model").seq_len == 8192  # a plan's reload of the same file
    assert _cap_warnings(caplog) == [
        f"{path}: max_position_embeddings 32768; planning for 8192-token training sequences "
        "(pass --seq-len to change)"]


def test_a_given_seq_len_is_no_guess(tmp_path, caplog) -> None:
    path = _config(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert load_model(path, seq_len=4096).seq_len == 4096
    assert _cap_warnings(caplog) == []


def test_a_stated_window_is_no_guess(tmp_path, caplog) -> None:
    scaled = {**LONG_CONTEXT, "rope_scaling": {"rope_type": "llama3", "factor": 4.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 4096}}
    with caplog.at_level(logging.WARNING):
        assert load_model(_config(tmp_path, scaled)).seq_len == 4096
    assert _cap_warnings(caplog) == []


@pytest.mark.parametrize(("command", "seq_len", "warnings"), [
    ("estimate", [], 1),
    ("estimate", ["--seq-len", "4096"], 0),
    ("search", ["--seq-len", "4096"], 0),
])
def test_commands_warn_once_and_only_without_seq_len(tmp_path, caplog, capsys, command,
                                                     seq_len, warnings) -> None:
    with caplog.at_level(logging.WARNING):
        code = main([command, "--model", _config(tmp_path), *seq_len, *TARGET])
    assert code == 0, capsys.readouterr().err
    assert len(_cap_warnings(caplog)) == warnings
    out = json.loads(capsys.readouterr().out)
    model = (out["plan"] if command == "estimate" else out["best"])["model"]
    planned = model["seq_len"] if isinstance(model, dict) else load_model(model).seq_len
    assert planned == (4096 if seq_len else 8192)


def test_a_model_folder_reads_its_config_json(tmp_path) -> None:
    """A Hugging Face user passes the folder they downloaded; it said 'unknown model'."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LONG_CONTEXT))
    assert load_model(str(folder), seq_len=4096) == load_model(
        str(folder / "config.json"), seq_len=4096)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="is a folder without a config.json"):
        load_model(str(empty))
