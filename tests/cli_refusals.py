"""What every test of a refused command line checks: exit code 2, one line on stderr naming
what it must, and nothing on stdout."""

from __future__ import annotations

from autoplan.commands import main


def assert_refused(capsys, argv: list[str], *needles: str) -> str:
    """Run `autoplan ARGV`; assert the one-line refusal holds every needle; return the line."""
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and not captured.out, err
    for needle in needles:
        assert needle in err, err
    return err
