"""The command line: thin sub-commands that return exit codes (DESIGN.md section 5).

0 success, 2 bad input, 3 nothing feasible. User mistakes arrive here as AutoplanError and leave
as one line on stderr; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from autoplan import __version__
from autoplan.errors import AutoplanError

log = logging.getLogger(__name__)

SUBCOMMAND_MODULES = (
    "autoplan.estimate_cli",
    "autoplan.search.cli",
    "autoplan.runtime.cli",
    "autoplan.export.cli",
    "autoplan.profiler.cli",
    "autoplan.calibrate_cli",
    "autoplan.tune.cli",
)
"""Each module's `register(subparsers)` adds its sub-commands; a module that is absent (a part
not built yet) is skipped."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse's own code)
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


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
        return int(args.func(args))
    except AutoplanError as err:
        sys.stderr.write(f"autoplan {args.command}: error: {err}\n")
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("autoplan: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
