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


RUNTIME_TARGETS = {"megatron": "megatron", "megatron-deepep": "megatron",
                   "megatron-allgather": "megatron", "nemo": "megatron",
                   "torchtitan": "torchtitan", "torchtitan-0.3": "torchtitan",
                   "deepspeed": "deepspeed"}
"""The `--to` target that writes the job each runtime preset prices (NeMo and Megatron-Core with
the DeepEP or all-gather dispatcher run Megatron-Core; torchtitan 0.2.2 and 0.3 are one target
in two formats, export.torchtitan.RUNTIMES). autoplan's own runtimes run through `autoplan
train` (any launcher); Megatron-LM's 2021/2022 releases have no target of their own (the
megatron target writes today's flags)."""
