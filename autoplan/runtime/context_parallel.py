"""Context parallelism: the sequence split over the cp group, attention over all-gathered K/V.

Layout (load-balanced causal, as Megatron-LM CP and torchtitan's head-tail balancer): the
sequence of S tokens is cut into 2*cp chunks of c = S/(2*cp); cp rank i holds chunks i and
2*cp-1-i, so every rank's causal attention work is c^2 * (2*cp + 1) multiply-adds per head.

Attention (Llama 3, Dubey et al. 2024, §3.3.2 "all-gather based"): each rank all-gathers K and V
(the kv heads, before GQA repeats them) over cp in one collective, restores natural order, and
attends each of its two query chunks to the keys up to the chunk's end, causal aligned lower
right (the chunk's queries are the last of those keys): SDPA gets torch's CausalBias, never a
dense mask, so CUDA runs FlashAttention-2 with its causal tile skip, as the cost model prices
(cost/compute.py attention_core_times_s), and CPU the math kernel. The gather is a DTensor Shard -> Replicate redistribute whose gradient is
declared Partial, so backward reduce-scatters dK and dV (summing every rank's contribution).
torch's own `context_parallel` dispatches only CUDA SDPA kernels; on CPU it raises "Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy".

Everything else is per token, so the rest of the model runs on the local 2c tokens; token and
RoPE positions are global (positions()); the loss is a mean over local tokens and gradients are
averaged over dp x cp by FSDP (data_parallel.fsdp_mesh), which makes it the global mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from autoplan.model_spec import RopeScaling

Core = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LoadBalancedLayout:
    """Which global chunks (and token positions) cp rank `rank` of `cp` holds."""

    def __init__(self, cp: int, rank: int) -> None:
        assert 0 <= rank < cp
        self.cp, self.rank = cp, rank

    @property
    def chunks(self) -> tuple[int, int]:
        """Global indices of this rank's two chunks, in local order."""
        return self.rank, 2 * self.cp - 1 - self.rank

    def positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Global positions (int64, shape (local_len,)) of this rank's tokens."""
        c = local_len // 2
        return torch.cat([torch.arange(j * c, (j + 1) * c, device=device) for j in self.chunks])

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's two chunks of a full-sequence tensor, concatenated along `dim`."""
        parts = t.chunk(2 * self.cp, dim=dim)
        return torch.cat([parts[j] for j in self.chunks], dim=dim).contiguous()

    def natural_order(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Index that turns the rank-ordered gather (rank r's chunks r, 2cp-1-r, then rank r+1's)
        into sequence order: global chunk j < cp is rank j's first half, j >= cp rank
        (2cp-1-j)'s second half."""
        c = local_len // 2
        starts = []
        for j in range(2 * self.cp):
            r, half = (j, 0) if j < self.cp else (2 * self.cp - 1 - j, 1)
            starts.append(r * local_len + half * c)
        return torch.cat([torch.arange(s, s + c, device=device) for s in starts])


class ContextParallel:
    """What an Attention / Embedding holding `context_parallel` calls (models/layers.py)."""

    def __init__(self, cp_mesh) -> None:
        self.mesh = cp_mesh
        self.size = cp_mesh.size()
        self.layout = LoadBalancedLayout(self.size, cp_mesh.get_local_rank())

    def positions(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        return self.layout.positions(local_len, device)

    def rope_cos_sin(self, local_len: int, head_dim: int, device: torch.device, theta: float,
                     scaling: RopeScaling | None = None):
        """RoPE tables (base theta, the model's scaling: Llama 3.1's or YaRN's, its cos/sin
        factor included) of the whole sequence, rows taken at this rank's global positions."""
        from autoplan.runtime.models.layers import rope_cos_sin

        cos, sin = rope_cos_sin(local_len * self.size, head_dim, device, theta, scaling)
        pos = self.positions(local_len, device)
        return cos[pos], sin[pos]

    def gather_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, kv_heads, L, d) local K, V -> (b, kv_heads, cp*L, d) of the whole sequence in
        natural order; one all-gather forward, one reduce-scatter of dK, dV backward."""
        from torch.distributed.tensor import DTensor, Partial, Shard

        kv = torch.stack((k, v))  # (2, b, kv_heads, L, d): one collective for both
        full = DTensor.from_local(kv, self.mesh, [Shard(3)], run_check=False).full_tensor(
            grad_placements=[Partial()]
        )
        full = full.index_select(3, self.layout.natural_order(k.shape[2], k.device))
        return full[0], full[1]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, core: Core
                  ) -> torch.Tensor:
        """Causal attention of this rank's queries q (b, heads, L, d) over the whole sequence;
        `core(q, k, v)` is the layer's attention kernel: causal with the queries at the end of
        the keys (models/layers.py Attention.core; it repeats GQA heads)."""
        k_all, v_all = self.gather_kv(k, v)
        c = q.shape[2] // 2
        outs = []
        for half, j in enumerate(self.layout.chunks):
            end = (j + 1) * c  # keys past this chunk's end are masked anyway: skip them
            outs.append(core(q[:, :, half * c:(half + 1) * c], k_all[:, :, :end],
                             v_all[:, :, :end]))
        return torch.cat(outs, dim=2)


def apply_cp(model: nn.Module, cp_mesh) -> int:
    """Point every attention and position embedding of `model` at the cp group; returns how
    many modules were hooked. Adds no parameters, so FQNs (and checkpoints) do not depend on
    cp."""
    ctx = ContextParallel(cp_mesh)
    hooked = 0
    for module in model.modules():
        if hasattr(module, "context_parallel"):
            module.context_parallel = ctx
            hooked += 1
    return hooked
