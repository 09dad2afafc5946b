"""Export a plan to the formats other runtimes and schedulers read, and import their configs.

One small module per target (see `registry.targets()`); `importers` reads DeepSpeed and Megatron
configurations back into a Plan; `cli` registers the `export` and `import` sub-commands.
"""

from __future__ import annotations

from autoplan.export.base import ExportOptions, ExportTarget, export_plan
from autoplan.export.registry import get_target, targets

__all__ = ["ExportOptions", "ExportTarget", "export_plan", "get_target", "targets"]
