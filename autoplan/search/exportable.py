"""Whether the export target of the runtime a search priced for writes its winner.

`search --runtime megatron` keeps to the plan and runtime rules, but a target can still refuse a
model as a whole (gpt-oss's YaRN without latent attention: Megatron-LM's arguments build YaRN for
MLA only) or a knob its files cannot state; the search then says so beside its winner instead
of leaving the user to find out at `export`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.search.engine import SearchResult


def export_refusals(result: SearchResult) -> dict[str, Any] | None:
    """{"target": T, "refused": [reasons]} for the winner and the `--to` target of the runtime
    it was priced for (export.registry.RUNTIME_TARGETS; [] where T writes it), or None: no
    winner, or a runtime without a target of its own (autoplan's: `autoplan train` runs it)."""
    from autoplan.export.base import ExportOptions
    from autoplan.export.registry import RUNTIME_TARGETS, get_target
    from autoplan.export.torchtitan import RUNTIMES as TORCHTITAN_FORMATS
    from autoplan.search.output import plans

    traits = result.request.runtime
    if result.best is None or traits is None:
        return None
    runtime = traits.base or traits.name
    name = RUNTIME_TARGETS.get(runtime)
    if name is None:
        return None
    plan = plans(result, np.array([result.best]))[0]
    fmt = next((f for f, rt in TORCHTITAN_FORMATS.items() if rt == runtime), "python")
    gpus_per_node = result.request.profile.gpus_per_node
    for t in result.request.types:  # the winner's own GPU type in a multi-type search
        if t.ref == plan.cluster.profile or t.profile.name == plan.cluster.profile:
            gpus_per_node = t.profile.gpus_per_node
    opts = ExportOptions(gpus_per_node=gpus_per_node, torchtitan_format=fmt)
    reasons = list(dict.fromkeys(get_target(name).check(plan, plan.model_spec(), opts)))
    return {"target": name, "refused": reasons}


def export_line(result: SearchResult) -> str | None:
    """"export: --to megatron cannot write the winner: ..." where the runtime's target refuses
    it, else None."""
    found = export_refusals(result)
    if not found or not found["refused"]:
        return None
    return (f"export: `autoplan export --to {found['target']}` cannot write the winner: "
            + "; ".join(found["refused"]))
