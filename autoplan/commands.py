"""The command line: thin sub-commands that return exit codes (DESIGN.md section 5).

0 success, 2 bad input, 3 nothing feasible, 130 Ctrl-C, 143 SIGTERM; 141 when the reader of the
output went away before all of it was written (`autoplan search ... | head`, as SIGPIPE ends Unix
tools), in every --format, and 1 when the output cannot be written (a full disk). User mistakes arrive here as AutoplanError and leave as one line
on stderr; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from autoplan import __version__
from autoplan.errors import AutoplanError
from autoplan.yaml_io import did_you_mean

log = logging.getLogger(__name__)

SUBCOMMAND_MODULES = (
    "autoplan.estimate_cli",
    "autoplan.search.cli",
    "autoplan.spaces_cli",
    "autoplan.runtime.cli",
    "autoplan.export.cli",
    "autoplan.profiler.cli",
    "autoplan.calibrate_cli",
    "autoplan.tune.cli",
)
"""Each module's `register(subparsers)` adds its sub-commands; a module that is absent (a part
not built yet) is skipped."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2, argparse's own code) that name the help of the
    (sub-)command given the bad input and the flags an unknown one likely misspells, and without
    abbreviated flags: `train --step 5` is refused, not read as --steps (allow_abbrev)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(  # type: ignore[override]  # argparse overloads it by namespace
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """Refuse what this parser does not know here, where its flags are at hand: argparse
        hands a sub-command's parser its arguments and would refuse the unknown ones later,
        from the top parser, naming 'autoplan --help' and none of the sub-command's flags."""
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self._refuse(f"unrecognized arguments: {' '.join(extras)}", self._unknown(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """argparse's refusal as the house line: `--flag: got ...` (the flag first, as a
        ConfigError names its field), not argparse's `argument --flag: got ...`."""
        message = message.removeprefix("argument ")
        if message.startswith("the following arguments are required"):
            unknown = self._unknown(self._given)  # --globl-batch-size leaves one missing
            if unknown:
                message += f"; unrecognized arguments: {' '.join(unknown)}"
            self._refuse(message, unknown)
        self._refuse(message, [])

    def _refuse(self, message: str, unknown: list[str]) -> NoReturn:
        """Exit 2 with `message`, a did-you-mean for each of the `unknown` flags close to one of
        ours (named when several are unknown), and where the help is; on one line."""
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for flag in unknown:
            hint = did_you_mean(flag, flags, 2, quote=False)
            if hint:
                message += f"; {flag}: {hint}" if len(unknown) > 1 else f"; {hint}"
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")

    def _unknown(self, args: list[str]) -> list[str]:
        """The flags among `args` this parser does not define (`--flag=value` as --flag)."""
        known = {o for a in self._actions for o in a.option_strings}
        names = (a.split("=", 1)[0] for a in args if re.match(r"-+[A-Za-z]", a))
        return [name for name in names if name not in known]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autoplan",
        description="Plan, search, run and export parallel training configurations.",
    )
    parser.add_argument("--version", action="version", version=f"autoplan {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name and name.startswith(err.name):
                continue
            raise
        module.register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or `kill`'s stop), raised where the program is, like Ctrl-C's
    KeyboardInterrupt, so the same cleanup runs: locks released, partial outputs removed."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated while the command runs (only the main thread can handle
    signals; a command run from another thread keeps the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_line(args: argparse.Namespace, err: KeyboardInterrupt) -> str:
    """One line: stopped by what, and how to resume when the work is kept in a study."""
    line = f"autoplan {args.command}: {'terminated' if isinstance(err, Terminated) else 'interrupted'}"
    storage, study = getattr(args, "storage", None), getattr(args, "study", None)
    if storage and study:
        line += (f"; the finished trials are kept in study {study!r} of --storage: rerun the "
                 "same command to resume")
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        with _sigterm_as_interrupt():
            code = int(args.func(args))
            sys.stdout.flush()  # here, not at exit, where a reader gone away is exit 120
            return code
    except AutoplanError as err:
        sys.stderr.write(f"autoplan {args.command}: error: {err}\n")
        return err.exit_code
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM as Terminated
        sys.stderr.write(interrupted_line(args, err) + "\n")
        return 143 if isinstance(err, Terminated) else 130
    except BrokenPipeError:  # the reader stopped reading: stop quietly
        _drop_stdout()
        return 141
    except OSError as err:
        if err.errno not in OUTPUT_FULL:
            raise
        _drop_stdout()
        sys.stderr.write(f"autoplan {args.command}: error: cannot write the output "
                         f"({os.strerror(err.errno)}); free space or write it elsewhere\n")
        return 1


OUTPUT_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors of an output that has no room (a full disk, a quota, /dev/full): the user's to fix."""


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what could not be written
    raises no second error on the way out (Python's documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
        pass


if __name__ == "__main__":
    sys.exit(main())
