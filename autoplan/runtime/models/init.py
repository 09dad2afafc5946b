"""Deterministic, layout-independent initialisation of a (possibly sharded) model.

Each parameter's full value is drawn from a generator seeded by (seed, FQN), so one process and
any parallel layout start from bitwise-equal weights; the full values are then loaded into the
sharded parameters with torch.distributed.checkpoint's set_model_state_dict.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from autoplan.runtime.names import clean_fqn
from autoplan.runtime.tied_embeddings import init_fqn, retie

INIT_STD = 0.02


VOCAB_FQNS = ("embed.tok.weight", "output.weight")


def full_init_value(fqn: str, shape: torch.Size, num_layers: int, seed: int,
                    vocab_size: int | None = None) -> torch.Tensor:
    """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2L), norms 1, biases 0.
    The vocabulary's padding rows (beyond `vocab_size`) are zero and the real rows are drawn as
    for an unpadded table, so every padding gives the same model."""
    if vocab_size is not None and fqn in VOCAB_FQNS and shape[0] > vocab_size:
        real = full_init_value(fqn, torch.Size((vocab_size, *shape[1:])), num_layers, seed)
        return torch.cat([real, torch.zeros((shape[0] - vocab_size, *shape[1:]))])
    name = fqn.rsplit(".", 1)[-1]
    if name == "bias":
        return torch.zeros(shape)
    if "norm" in fqn:
        return torch.ones(shape)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**63)
    std = INIT_STD
    if fqn.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        std = INIT_STD / math.sqrt(2 * num_layers)
    return torch.randn(shape, generator=gen) * std


def materialize_and_init(
    module: nn.Module, device: torch.device, num_layers: int, seed: int, tied: bool = False
) -> None:
    """Allocate a meta-device (possibly sharded) module on `device` and load the initial weights.
    `tied`: the head weight is drawn as the embedding's, so a pipeline's two copies start equal."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    spec = getattr(module, "spec", None)  # a Transformer or a pipeline stage of one
    vocab = spec.vocab_size if spec is not None else None
    module.to_empty(device=device)
    if tied:  # to_empty gives each module its own plain tensor (DTensors keep the tie)
        retie(module)
    with torch.no_grad():
        for fqn, t in module.state_dict().items():
            name = init_fqn(clean_fqn(fqn), tied)
            full = full_init_value(name, t.shape, num_layers, seed, vocab).to(device, t.dtype)
            if isinstance(t, DTensor):
                shard = distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None)
                t.to_local().copy_(shard.to_local())
            else:
                t.copy_(full)
