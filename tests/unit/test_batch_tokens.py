"""A global batch given in tokens is refused (user test 37, finding 1): 4,194,304 "sequences"
at seq 8192 is 34B tokens a step, 500x the largest published batch, which a search planned as
a 13-hour step. The line names the tokens it makes and the sequences meant; estimate's header
says the tokens a step."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan_args import MAX_BATCH_TOKENS, check_batch_tokens
from tests.cli_refusals import assert_refused

L8B = ["--model", "llama-3.1-8b", "--cluster", "h100-sxm-80gb", "--num-gpus", "64"]


@pytest.mark.parametrize("command", ["search", "estimate"])
def test_a_batch_in_tokens_is_refused_naming_the_sequences_meant(capsys, command: str) -> None:
    assert_refused(capsys, [command, *L8B, "--global-batch-size", "4194304", "--format", "json"],
                   "--global-batch-size: 4,194,304 sequences x 8,192 tokens = 34.4B tokens a "
                   "step", "it counts sequences: a 4.19M-token batch is 512")


def test_a_search_range_reaching_past_it_is_refused(capsys) -> None:
    assert_refused(capsys, ["search", *L8B, "--global-batch-size", "1M..4M", "--format", "json"],
                   "1,048,576..4,194,304 reaches 4,194,304 sequences",
                   "1.05M..4.19M tokens is 128..512")
    assert_refused(capsys, ["search", *L8B, "--global-batch-size", "256..40000"],
                   "give at most 32,768 at seq 8,192")


def test_the_bound_is_tokens_so_it_moves_with_the_sequence_length() -> None:
    check_batch_tokens(MAX_BATCH_TOKENS // 8192, 8192)  # 32,768 x 8k: at the bound
    check_batch_tokens("1..65536", 4096)
    with pytest.raises(ConfigError, match="about 488"):  # 4e6 / 8192 = 488.3
        check_batch_tokens(4_000_000, 8192)
    with pytest.raises(ConfigError, match="give at most 65,536 at seq 4,096"):
        check_batch_tokens("1..65537", 4096)


def test_a_published_batch_passes_and_the_header_says_its_tokens(capsys) -> None:
    # DeepSeek-V3's 15,360 x 4,096 (63M tokens), the largest published, is no mistake
    assert main(["estimate", "--model", "deepseek-v3", "--cluster", "h800-sxm-80gb",
                 "--num-gpus", "1024", "--global-batch-size", "15360", "--format", "json"]) in (0, 3)
    assert json.loads(capsys.readouterr().out)["plan"]["batch"]["global_batch_size"] == 15360
    assert main(["estimate", *L8B, "--global-batch-size", "512", "--format", "table"]) in (0, 3)
    assert "gbs=512 (4.19M tokens)" in " ".join(capsys.readouterr().out.split())


def test_a_batch_in_tokens_given_by_set_or_plan_is_refused_too(capsys, tmp_path) -> None:
    """Review A (session 37): `--set batch.global_batch_size=4194304` skipped the check the
    flag gets; the plan's field is named as given."""
    assert_refused(capsys, ["estimate", *L8B, "--set", "batch.global_batch_size=4194304",
                            "--format", "json"],
                   "batch.global_batch_size: 4,194,304 sequences x 8,192 tokens",
                   "a 4.19M-token batch is 512")
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: llama-3.1-8b\ncluster: {profile: h100-sxm-80gb, num_gpus: 64}\n"
                    "parallel: {dp: 64}\nbatch: {micro_batch_size: 1, global_batch_size: "
                    "4194304}\n")
    assert_refused(capsys, ["estimate", "--plan", str(plan), "--format", "json"],
                   "batch.global_batch_size: 4,194,304 sequences")


def test_a_batch_under_a_million_tokens_reads_whole_as_typed() -> None:
    """plan_args._tokens keeps whole digits below 1M rather than display.count's decimal k:
    --global-batch-size 128k is 131,072 (binary), which "131k" would misread."""
    with pytest.raises(ConfigError, match="a 131,072-token batch is 32$"):
        check_batch_tokens(131_072, 4096)  # 128k at seq 4k: 512M tokens a step
    with pytest.raises(ConfigError, match="65,536..262,144 tokens is 16..64$"):
        check_batch_tokens("65536..262144", 4096)
