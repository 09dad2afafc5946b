"""Thin shim: `python cli.py ...` is `autoplan ...`."""

import sys

from autoplan.commands import main

if __name__ == "__main__":
    sys.exit(main())
