"""One validity rule (a vectorised test of a plan table and its one-row message) and the
helpers the rule families' messages share; the families are plan_rules_layout, plan_rules_moe
and plan_rules_runtime, and plan_rules applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autoplan.model_spec import ModelSpec
from autoplan.plan_table import Table, col


def divisors(n: int, proper: bool = False) -> str:
    """The divisors of n (below n when `proper`), as a short list."""
    ds = [str(d) for d in range(1, n if proper else n + 1) if n % d == 0]
    return ", ".join(ds if len(ds) <= 12 else [*ds[:6], "...", *ds[-3:]])


def row_int(t: Table, name: str, i: int) -> int:
    return int(col(t, name)[i])


@dataclass(frozen=True)
class Rule:
    key: str
    """Short name used to count rejected candidates."""
    violated: Callable[[Table, ModelSpec], np.ndarray | np.bool_]
    """Which rows break the rule (a scalar where it depends on the model alone)."""
    message: Callable[[Table, int, ModelSpec], str]

