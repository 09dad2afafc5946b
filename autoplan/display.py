"""Numbers for people: significant figures, column-wise decimals and compact counts.

Tables and YAML output round what they show; JSON keeps full precision for machines.
"""

from __future__ import annotations

import math
import shutil
from typing import Any


def sig(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant figures, without an exponent for ordinary sizes."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    value = float(f"{value:.{digits}g}")
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= 15 or magnitude < -6:
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{max(0, digits - 1 - magnitude)}f}"


def column(values: list[float], total: float, digits: int = 3) -> list[str]:
    """Each value with the decimals that give `total` `digits` significant figures; a nonzero
    value that would round to zero reads "<0.01" (say) rather than a misleading 0."""
    if total <= 0 or not math.isfinite(total):
        return [sig(v, digits) for v in values]
    decimals = max(0, digits - 1 - math.floor(math.log10(total)))
    floor = 10.0 ** -decimals
    return ["0" if v == 0 else f"<{floor:.{decimals}f}" if abs(v) < floor / 2
            else f"{v:.{decimals}f}" for v in values]


def whole(value: float) -> str:
    """A count or rate with thousands separators ("1,500,000"); from 1e15 on in exponent form
    (3 significant figures), where the other digits of a float are noise."""
    return f"{value:,.0f}" if abs(value) < 1e15 else f"{value:.3g}"


def days(value: float) -> str:
    """Days to train: one decimal; two significant digits below a tenth (a short run read as
    "0.0"); three from a thousand on (a budget far past any cluster's reach printed every digit
    of a float)."""
    if 0 < value < 0.1:
        return sig(value, 2)
    return f"{value:.1f}" if value < 1000 else sig(value, 3)


EXACT_BELOW = 10_000
"""Counts below this print whole ("1,024 tokens"): four digits read at a glance."""


def count(n: float) -> str:
    """A parameter or token count for people: whole below EXACT_BELOW ("1,024"), else to 3
    significant figures with k, M, B or T: 32.8k, 125M, 8.03B, 1.20T (a 1,024-token batch read
    "0.0010M" when every count below a billion was in millions: user test 38)."""
    if abs(n) < EXACT_BELOW:
        return f"{n:,.0f}"
    rounded_n = float(f"{n:.3g}")  # 999,950 is 1.00M, not 1,000k
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(rounded_n) >= scale:
            return f"{sig(rounded_n / scale, 3)}{suffix}"
    return f"{sig(rounded_n / 1e3, 3)}k"


def rounded(obj: Any, digits: int = 4) -> Any:
    """A copy of nested data with every float at `digits` significant figures (for YAML)."""
    if isinstance(obj, bool) or isinstance(obj, int) or obj is None:
        return obj
    if isinstance(obj, float):
        if obj == 0 or not math.isfinite(obj):
            return obj
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def terminal_width() -> int:
    """COLUMNS when set, else the terminal's width, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def bias_words(bias: float) -> str:
    """A band's lean in words, appended to "validation error of runs of this kind"
    (CostEstimate.error_bias: mean measured / predicted - 1 of those runs); empty under 0.5%."""
    if abs(bias) < 0.005:
        return ""
    return (f", which took {bias:.0%} longer than priced on average" if bias > 0
            else f", which took {-bias:.0%} less time than priced on average")


def tight_words(memory: dict[str, float]) -> str:
    """Why a plan that fits is tight (CostEstimate.memory["tight_by"] > 0), in one sentence."""
    from autoplan.cost import memory as mem

    gib = 2.0**30
    return (f"fits with the allocator slack priced ({mem.FRAGMENTATION:.2%} of what it "
            f"allocates, the median of 30 published OOM messages) but at their 75th percentile "
            f"({mem.FRAGMENTATION_P75:.2%}) needs {memory['tight_by'] / gib:.1f} GiB more than "
            f"the {memory['capacity'] / gib:.1f} GiB per GPU: it may not fit")


def unvalidated_words(mfu: float, ceiling: Any, cpu: bool = False) -> str:
    """Why a predicted MFU above what the validated runs of its kind on its GPU were predicted
    at (error_band.MfuCeiling) is an extrapolation, in one sentence. `autoplan tune` measures
    the machine it runs on: the GPUs priced, or for a CPU profile (`cpu`) this host."""
    where = "on this machine" if cpu else "on those GPUs"
    return (f"MFU {mfu:.1%} is above {ceiling.describe()}: the validation does not reach it, "
            f"so measure it (autoplan tune, {where}) before relying on it")
