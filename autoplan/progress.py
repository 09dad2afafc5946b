"""Progress of long work in every mode: a rich bar when stderr is a terminal, otherwise one plain
line to stderr every few seconds (CI logs, pipes), so a 3-minute run is never silent.

`tracker(label)` yields a `Tracker`: call it as `tracker(stage, done, total)` (the search
engine's `Progress` callback), or use `add_task` / `update` / `advance`, the subset of
`rich.progress.Progress` the profiler drives.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

EVERY_S = 5.0
"""Seconds between plain progress lines (AUTOPLAN_PROGRESS_EVERY_S overrides)."""


def every_s() -> float:
    try:
        return max(0.0, float(os.environ.get("AUTOPLAN_PROGRESS_EVERY_S", EVERY_S)))
    except ValueError:
        return EVERY_S


class Tracker:
    """One task's progress, shown as a rich bar or as throttled plain lines."""

    def __init__(self, label: str, bar: Any = None, stream: IO[str] | None = None,
                 every: float = EVERY_S) -> None:
        self.label, self.bar, self.stream, self.every = label, bar, stream, every
        self.description, self.done = "starting", 0
        self.total: int | None = None
        self.start = time.monotonic()
        self.last_line = self.start  # the first line after `every` seconds: quick work is quiet
        self.lines = 0
        self.printed: tuple[str, int, int | None] | None = None
        """The state the last plain line showed."""
        self.ended = False
        self.task = bar.add_task("starting", total=None) if bar is not None else None

    # --- the engine's Progress callback ------------------------------------------------------
    def __call__(self, stage: str, done: int, total: int | None) -> None:
        self.description, self.done, self.total = stage, done, total
        self._show()

    # --- the rich.progress.Progress subset the profiler uses ---------------------------------
    def add_task(self, description: str, total: int | None = None) -> int:
        self.description, self.total = description, total
        self._show()
        return 0

    def update(self, task: int = 0, *, description: str | None = None,
               completed: int | None = None, total: int | None = None) -> None:
        if description is not None:
            self.description = description
        if completed is not None:
            self.done = completed
        if total is not None:
            self.total = total
        self._show()

    def advance(self, task: int = 0, advance: int = 1) -> None:
        self.done += advance
        self._show()

    # -----------------------------------------------------------------------------------------
    @property
    def skipped(self) -> int:
        """Steps of the last stage never done, once the work has ended (0 while it runs): a
        search that stops early, e.g. at the fewest GPUs that meet the target."""
        return max(self.total - self.done, 0) if self.ended and self.total else 0

    @property
    def state(self) -> tuple[str, int, int | None]:
        return self.description, self.done, self.total

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return f"{self.label}: {self.description} {count}{share}{skipped}, {elapsed:.0f} s"

    def _show(self, force: bool = False) -> None:
        if self.bar is not None:
            skipped = f" ({self.skipped} skipped)" if self.skipped else ""
            self.bar.update(self.task, description=self.description + skipped,
                            completed=self.done, total=self.total)
            return
        now = time.monotonic()
        if self.stream is not None and (force or now - self.last_line >= self.every):
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self.last_line = now
            self.lines += 1
            self.printed = self.state

    def finish(self) -> None:
        """The end as it is: the last state when the lines or the bar have not shown it yet
        (never a share the work did not reach; the rest marked skipped), then "done in"."""
        self.ended = True
        if self.bar is not None:
            self._show()
        elif self.stream is not None and self.lines:
            if self.printed != self.state or self.skipped:
                self._show(force=True)
            elapsed = time.monotonic() - self.start
            self.stream.write(f"{self.label}: done in {elapsed:.0f} s\n")
            self.stream.flush()


@contextmanager
def tracker(label: str, console: Any = None, stream: IO[str] | None = None,
            every: float | None = None) -> Iterator[Tracker]:
    """A rich bar on `console` (default: stderr) when it is a terminal, else plain lines on
    `stream` (default: sys.stderr) at most every `every` seconds; when the work ends (not when
    it raises), the state it ended in and a last "done in" line."""
    if console is None:
        from autoplan.cli_common import stderr_console

        console = stderr_console()
    if console.is_terminal and stream is None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(SpinnerColumn(), TextColumn(f"{label}: {{task.description:<50}}"),
                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar:
            t = Tracker(label, bar=bar)
            yield t
            t.finish()  # the bar's last frame: what was done, the rest marked skipped
        return
    t = Tracker(label, stream=stream or sys.stderr, every=every_s() if every is None else every)
    yield t
    t.finish()  # only when the work ended: stopped by an error, it is not done
