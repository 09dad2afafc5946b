"""One exception hierarchy for autoplan.

Every error a user can cause derives from `AutoplanError` and carries a one-line message that
names the field, the value and the fix; the CLI maps each class to an exit code.
"""

from __future__ import annotations


class AutoplanError(Exception):
    """Base class of every error autoplan raises on purpose."""

    exit_code = 1


class ConfigError(AutoplanError):
    """Bad user input: an unknown key, a wrong type or value, a missing file (exit code 2)."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        # one line always: a key or value with a line break in it is shown escaped
        field, problem = _one_line(field), _one_line(problem)
        fix = _one_line(fix) if fix else fix
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}" if field else problem
        if fix:
            message += f"; {fix}"
        super().__init__(message)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


class InfeasiblePlanError(AutoplanError):
    """A plan that is well-formed but cannot run as asked (exit code 3)."""

    exit_code = 3


class NoFeasiblePlanError(AutoplanError):
    """A search found no plan meeting the constraints (exit code 3)."""

    exit_code = 3


class RuntimeLaunchError(AutoplanError):
    """The runtime could not start or finish a training job (exit code 1)."""

    exit_code = 1
