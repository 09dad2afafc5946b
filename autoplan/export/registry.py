"""The explicit registry of export targets: `--to NAME` -> target. Add a target here."""

from __future__ import annotations

from autoplan.errors import ConfigError
from autoplan.export.base import ExportTarget


def targets() -> dict[str, ExportTarget]:
    """Every registered target by name, in --help order."""
    from autoplan.export.deepspeed import DeepSpeedTarget
    from autoplan.export.kubernetes import KubernetesTarget
    from autoplan.export.megatron import MegatronTarget
    from autoplan.export.slurm import SlurmTarget
    from autoplan.export.torchrun import TorchrunTarget
    from autoplan.export.torchtitan import TorchtitanTarget

    found = (
        SlurmTarget(),
        KubernetesTarget(),
        TorchrunTarget(),
        DeepSpeedTarget(),
        MegatronTarget(),
        TorchtitanTarget(),
    )
    return {t.name: t for t in found}


TARGET_NAMES = ("slurm", "kubernetes", "torchrun", "deepspeed", "megatron", "torchtitan")
"""Names for argparse choices without importing every target (checked by the contract test)."""


def get_target(name: str) -> ExportTarget:
    known = targets()
    if name not in known:
        raise ConfigError("--to", f"unknown target {name!r}", f"choose one of {', '.join(known)}")
    return known[name]
