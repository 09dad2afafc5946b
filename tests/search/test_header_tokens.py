"""The search header says the tokens a step beside the global batch ("global batch 1536 (3.15M
tokens)"), at the sequence length the search priced, and summary JSON keeps the same figure as
global_batch_tokens (render.header, render.batch_text, output.summary)."""

from __future__ import annotations

import io

from rich.console import Console

from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest, run_search
from autoplan.search.output import summary
from autoplan.search.render import batch_text, header, render
from autoplan.search.targets import Targets
from autoplan.search_space import space_from_dict
from tests.search.conftest import SMALL_SPACE


def test_one_batch_reads_with_its_tokens_a_step() -> None:
    assert batch_text({"global_batch_size": 1536}, 2048) == "1536 (3.15M tokens)"
    assert batch_text({"global_batch_size": 16}, 64) == "16 (1,024 tokens)"


def test_a_batch_range_reads_with_the_tokens_of_both_ends() -> None:
    data = {"global_batch_size": 1024, "global_batch_range": [1024, 4096]}
    assert batch_text(data, 4096) == "1024..4096 (4.19M..16.8M tokens)"


def search(seq_len: int) -> tuple[str, dict]:
    """A tiny-model search at `seq_len` (as --seq-len gives it): the header printed, the JSON."""
    model = load_model("tiny", "--model", seq_len)
    req = SearchRequest(model, "tiny", load_profile("cpu-gloo"), "cpu-gloo",
                        space_from_dict(SMALL_SPACE), (4,), 8, Targets())
    result = run_search(req)
    data = summary(result, top=3)
    console = Console(width=200, record=True, file=io.StringIO())
    render(console, result, data, 3)
    return console.export_text().splitlines()[0], data


def test_the_header_and_json_count_tokens_at_the_searched_seq_len() -> None:
    short, short_data = search(64)
    long, long_data = search(128)
    assert "global batch 8 (512 tokens)," in short
    assert "global batch 8 (1,024 tokens)," in long
    assert short_data["global_batch_tokens"] == 8 * 64
    assert long_data["global_batch_tokens"] == 8 * 128
    assert short_data["global_batch_size"] == long_data["global_batch_size"] == 8


def test_the_header_keeps_its_other_fields() -> None:
    data = {"model": "gpt3-175b", "num_gpus": [1024], "cluster": "a100-sxm4-80gb",
            "global_batch_size": 1536, "space": "default", "runtime": "autoplan-cuda",
            "sampler": "exhaustive", "candidates": 1_614_816, "scored": 184_626,
            "feasible_count": 87_534, "seconds": 2.5}
    assert header(data, 2048) == (
        "[bold]gpt3-175b[/] on 1024 x a100-sxm4-80gb, global batch 1536 (3.15M tokens), space "
        "default, priced for runtime autoplan-cuda: exhaustive search, 1,614,816 candidates, "
        "184,626 scored, 87,534 feasible in 2.50 s")
