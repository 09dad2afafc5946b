"""DeepSeek-V3's router (arXiv 2412.19437 §2.1.2): sigmoid affinities, group-limited selection
by affinity plus a per-expert bias, and the bias update that balances the experts' load.

The routing is a pure function (`sigmoid_route`); `ExpertBias` holds one MoE layer's bias and
the tokens it routed this step; `update_expert_biases` sums those counts over the ranks that saw
different tokens and moves every bias after the optimizer step (called by the trainer).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

GATE_EPS = 1e-20
"""Added to the sum of the chosen affinities before dividing (transformers'
DeepseekV3TopkRouter, Megatron-Core topk_routing_with_score_function)."""
GROUP_SCORE_EXPERTS = 2
"""A group's score is the sum of its two highest biased affinities (transformers'
DeepseekV3TopkRouter.get_topk_indices, `.topk(2, dim=-1)[0].sum(dim=-1)`)."""
LOAD_MESH_DIMS = ("dp_replicate", "dp_shard", "cp")
"""World-mesh dimensions over which ranks route different tokens (mesh.py): their counts are
summed. Not tp: autoplan runs the router on the whole (gathered) sequence on every tp rank
(expert_parallel.moe_tp_plan), so the tp ranks count the same tokens; Megatron-Core sums over
tp x cp x dp (moe_utils.get_updated_expert_bias) because its tp ranks route their own
sequence-parallel shard. ep folds into dp x cp x tp and adds no ranks of its own."""


def top_k_stable(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (T, k) of the k largest logits per row; ties go to the lower expert index (a
    stable descending sort), so the choice does not depend on the kernel. Both routers use it
    (models/moe.py imports it from here)."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]


def choose_experts(biased: torch.Tensor, k: int, groups: int, groups_per_token: int
                   ) -> torch.Tensor:
    """Expert indices (T, k) of the k largest biased affinities s + b (T, E) among the experts of
    each token's `groups_per_token` best groups (DeepSeek-V3's node-limited routing, §2.2: each
    group scored by the sum of its two best s + b, as transformers' DeepseekV3TopkRouter and
    Megatron-Core's group_limited_topk with topk / group_topk = 2). The other experts are
    masked with -inf as Megatron-Core does (transformers masks with 0.0, which differs only
    where an allowed s + b is negative)."""
    t, e = biased.shape
    if groups > 1 and groups_per_token < groups:
        per_group = biased.view(t, groups, e // groups)
        score = per_group.topk(GROUP_SCORE_EXPERTS, dim=-1).values.sum(-1)  # (T, G)
        keep = torch.zeros(t, groups, dtype=torch.bool, device=biased.device)
        keep.scatter_(1, top_k_stable(score, groups_per_token), True)
        allowed = keep.repeat_interleave(e // groups, dim=1)  # (T, E)
        biased = biased.masked_fill(~allowed, float("-inf"))
    return top_k_stable(biased, k)


def sigmoid_route(logits: torch.Tensor, bias: torch.Tensor, k: int, groups: int,
                  groups_per_token: int, scale: float, chosen: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gates (T, k), fp32, and experts (T, k) of DeepSeek-V3's router (§2.1.2, eqs. 13-16):
    s = sigmoid(u^T e) in fp32; experts by top-k of s + b (bias for selection only); gates
    g = s_chosen / sum(s_chosen) * scale (norm_topk_prob, routed_scaling_factor). The gradient
    reaches the router through s; b has none. `chosen` (tests' token-index router): these
    experts instead of the selection."""
    s = torch.sigmoid(logits.float())  # (T, E)
    if chosen is None:
        with torch.no_grad():
            chosen = choose_experts(s.detach() + bias.float(), k, groups, groups_per_token)
    picked = s.gather(-1, chosen)
    gates = picked / (picked.sum(-1, keepdim=True) + GATE_EPS)
    return (gates * scale if scale != 1.0 else gates), chosen


class ExpertBias(nn.Module):
    """One MoE layer's load-balancing bias b (E,), fp32: a persistent buffer, so checkpoints
    (DCP, by FQN `...feed_forward.balance.bias`) save and restore it and the initialiser zeroes
    it (init.full_init_value: names ending in `bias` start at 0). `loads` holds the tokens
    routed to each expert by each training forward since the last update (a plain attribute,
    not a buffer: DDP would broadcast a buffer from rank 0)."""

    def __init__(self, num_experts: int, rate: float) -> None:
        super().__init__()
        self.rate = rate
        self.register_buffer("bias", torch.zeros(num_experts, dtype=torch.float32))
        self.loads: list[torch.Tensor] = []

    def count(self, chosen: torch.Tensor) -> None:
        """Record a training forward's choices (T, k) as a per-expert load (E,): not in
        evaluation or under no_grad (as Megatron-Core's TopKRouter._apply_expert_bias), and
        not when activation recomputation re-runs the forward inside backward (Megatron-Core
        tells its reentrant recompute by torch.is_grad_enabled(); non-reentrant checkpointing,
        autoplan's, leaves grad on, so the autograd engine's task id tells)."""
        if not (self.training and torch.is_grad_enabled()) \
                or torch._C._current_graph_task_id() != -1:
            return
        self.loads.append(torch.bincount(chosen.detach().reshape(-1),
                                         minlength=self.bias.numel()))

    def step_load(self, micro_batches: int | None) -> torch.Tensor:
        """This step's load (E,), int64: the sum over its last `micro_batches` forwards (None:
        all). Earlier ones are not this step's micro-batches: torch.distributed.pipelining's
        metadata inference (PipelineStage._forward_metadata_inference, torch 2.13) runs each
        stage once on its first step's inputs, or on empty tensors, before the schedule runs
        the real micro-batches. Clears the record."""
        loads = self.loads if micro_batches is None else self.loads[-micro_batches:]
        self.loads = []
        if not loads:
            return torch.zeros_like(self.bias, dtype=torch.long)
        return torch.stack(loads).sum(0)

    @torch.no_grad()
    def apply_update(self, load: torch.Tensor) -> None:
        """b_i += rate * sign(mean load - load_i) (§2.1.2), load (E,) over the global batch.
        The sign is taken on integers (sum(load) - E * load_i), so every rank agrees exactly;
        it is unchanged by scaling every load alike (counting each token twice)."""
        offset = load.sum() - load.numel() * load
        self.bias.add_(torch.sign(offset).to(self.bias.dtype), alpha=self.rate)


def bias_modules(parts: list[nn.Module]) -> list[ExpertBias]:
    """Every ExpertBias of this rank's model chunks, in module order."""
    return [m for part in parts for m in part.modules() if isinstance(m, ExpertBias)]


def load_groups(mesh) -> list:
    """Process groups whose ranks route different tokens: the non-trivial LOAD_MESH_DIMS."""
    return [mesh[name].get_group() for name in LOAD_MESH_DIMS if mesh[name].size() > 1]


def update_expert_biases(parts: list[nn.Module], mesh, micro_batches: int | None = None,
                         skipped: bool = False) -> None:
    """After the optimizer step: sum every layer's load of the step's `micro_batches` over
    the dp x cp ranks (one all-reduce per mesh dimension for all layers together) and move
    each bias. A skipped step (fp16 overflow) forgets its load and leaves the biases. No
    collective where a rank has no aux-free layer (its whole dp x cp group holds the same
    pipeline stage)."""
    layers = bias_modules(parts)
    if not layers:
        return
    loads = torch.stack([m.step_load(micro_batches) for m in layers])  # (layers, E), int64
    if skipped:
        return
    if mesh is not None and dist.is_initialized():
        for group in load_groups(mesh):
            dist.all_reduce(loads, group=group)
    for m, load in zip(layers, loads, strict=True):
        m.apply_update(load)
