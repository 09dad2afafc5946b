"""Rich tables of the profiler's layer measurements against the cost model's predictions."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def layer_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="per-layer fwd+bwd time: measured vs cost model (this profile)",
              caption="ratio = measured / predicted over every measured shape; parts of a "
              "block exclude the per-op dispatch the model charges per block; '-': not charged")
    for c in ("model", "layer", "shapes", "largest", "measured ms", "predicted ms",
              "ratio median", "ratio range"):
        t.add_column(c, justify="left" if c in ("model", "layer", "largest") else "right")
    for r in rows:
        rng = ("-" if r["ratio_min"] is None
               else f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}")
        t.add_row(r["model"], r["layer"], str(r["shapes"]), r["largest"], _ms(r["measured_s"]),
                  _ms(r["predicted_s"]), _x(r["ratio_median"]), rng)
    return t


def saved_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="bytes one block keeps for backward: measured vs cost/activations.py",
              caption="runtime Block + recompute wrappers, flash (SDPA) attention, no SP")
    for c in ("model", "mbs x seq", "tp", "policy", "measured KiB", "predicted KiB", "ratio"):
        t.add_column(c, justify="left" if c in ("model", "policy") else "right")
    for r in rows:
        t.add_row(r["model"], f"{r['mbs']}x{r['seq']}", str(r["tp"]), r["policy"],
                  f"{r['bytes'] / 1024:,.1f}", f"{r['predicted'] / 1024:,.1f}", _x(r["ratio"]))
    return t
