"""Progress that ends short of its total (`--objective gpus` stops at the fewest GPUs that meet
the target) ends showing what was done, the rest marked skipped, never a 100% it did not reach."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from autoplan import progress
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.progress import tracker
from autoplan.search.engine import SearchRequest, run_search
from autoplan.search.targets import Targets
from autoplan.search_space import load_space


class Clock:
    """time.monotonic for autoplan.progress, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_end_with_the_counts_done_and_the_rest_skipped(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    with tracker("search", Console(file=io.StringIO()), stream=out, every=5.0) as t:
        for k in range(89):  # one GPU count after another, a line every 5 s at most
            clock.now = k * 0.1
            t("GPU counts", k, 121)
        clock.now = 9.0
        t("GPU counts", 89, 121)  # 768 GPUs meet the target: the larger counts are not scored
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("search: GPU counts 50/121 (41%)")  # 5 s in
    assert lines[-2] == "search: GPU counts 89/121 (74%), 32 skipped, 9 s"
    assert lines[-1] == "search: done in 9 s"
    assert not any("121/121" in line or "100%" in line for line in lines)


def test_work_done_in_full_prints_its_last_state_once(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    with tracker("search", Console(file=io.StringIO()), stream=out, every=5.0) as t:
        for k in range(5):
            clock.now = 5.0 * k
            t("trials", k, 4)
    assert out.getvalue().splitlines() == [
        "search: trials 1/4 (25%), 5 s", "search: trials 2/4 (50%), 10 s",
        "search: trials 3/4 (75%), 15 s", "search: trials 4/4 (100%), 20 s",
        "search: done in 20 s"]


def test_the_bar_ends_on_the_counts_done_with_the_rest_skipped() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    with tracker("search", console) as t:
        t("GPU counts", 88, 121)
        t("GPU counts", 89, 121)
    shown = screen.getvalue()
    assert "GPU counts (32 skipped)" in shown and "89/121" in shown
    assert "121/121" not in shown


def test_an_interrupted_search_is_not_done(monkeypatch) -> None:
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), tracker("search", Console(file=io.StringIO()),
                                                   stream=out, every=0.0) as t:
        t("GPU counts", 3, 121)
        raise KeyboardInterrupt
    assert out.getvalue() == "search: GPU counts 3/121 (2%), 0 s\n"


def test_a_gpus_search_that_stops_early_ends_on_the_counts_it_scored() -> None:
    prof = load_profile("cpu-gloo")
    req = SearchRequest(load_model("tiny"), "tiny", prof, "cpu-gloo", load_space("small-cpu"),
                        (1, 2, 4, 8), 16, Targets(("gpus",)))
    # count by count (the route where the gpus objective stops early), not in one pass
    req = dataclasses.replace(req, space=dataclasses.replace(
        req.space, max_enumerate=req.largest_count_rows()))
    out = io.StringIO()
    with tracker("search", Console(file=io.StringIO()), stream=out, every=0.0) as t:
        result = run_search(req, t)
    assert result.best is not None and result.scored.cols["num_gpus"][result.best] == 1
    assert out.getvalue().splitlines()[-2].startswith("search: GPU counts 1/4 (25%), 3 skipped")
