"""Mixture-of-experts MLP block: a router, routed experts (the model's MLP kind) and shared experts.

Dropless by default: every token goes to its top-k experts, grouped by expert with a stable
argsort; the experts run on whatever tokens they get. With a capacity factor each expert takes
at most its capacity of each sequence's tokens and the rest are dropped (capacity_mask). Where
the experts live is the dispatcher's business (expert_parallel.py sends token groups to the
ranks that hold them); here all are local.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.model_spec import MlpKind, ModelSpec
from autoplan.runtime.models.aux_free import ExpertBias, sigmoid_route, top_k_stable
from autoplan.runtime.models.layers import FeedForward

ROUTER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROUTERS = ("learned", "token-index")
"""learned: top-k of the router scores; token-index: a fixed assignment by sequence position
(tests only, through RuntimeOptions.moe_router), so layouts cannot differ by a near-tie."""


class GroupedLinear(nn.Module):
    """E independent linear maps stacked: weight (E, out, in), bias (E, out); expert e maps the
    e-th group of rows. Under expert parallelism weight and bias are DTensors sharded on dim 0
    over ep and, with etp > 1, on the FFN dimension over etp (expert_parallel.apply_ep)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int,
                 bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(num_experts, out_features)) if bias else None

    def local(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This rank's experts (the local shard of a DTensor; differentiable)."""
        w, b = self.weight, self.bias
        if hasattr(w, "to_local"):
            w = w.to_local()
            b = b.to_local() if b is not None else None
        return w, b


class Experts(nn.Module):
    """The routed experts of one layer: E copies of the model's MLP (SwiGLU/GeGLU/GELU, as
    layers.FeedForward), each expert_ffn_hidden_size wide."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        assert spec.moe is not None
        e, h, f = spec.moe.num_experts, spec.hidden_size, spec.moe.expert_ffn_hidden_size
        self.num_experts = e
        self.mlp = spec.mlp
        self.w1 = GroupedLinear(e, h, f, spec.bias)
        self.w2 = GroupedLinear(e, f, h, spec.bias)
        if spec.mlp in (MlpKind.SWIGLU, MlpKind.GEGLU):
            self.w3 = GroupedLinear(e, h, f, spec.bias)
        self.partial_bias = None
        """Set by expert_parallel.apply_ep with etp > 1: (w2's local bias) -> the bias this
        rank adds to its partial sums, so that their sum over etp holds it once."""

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: (sum(counts), h) rows grouped by local expert, counts[e] rows for expert e.
        Under etp > 1 the outputs are this rank's partial sums (its slice of the FFN)."""
        w1, b1 = self.w1.local()
        w2, b2 = self.w2.local()
        if b2 is not None and self.partial_bias is not None:
            b2 = self.partial_bias(b2)
        w3, b3 = self.w3.local() if hasattr(self, "w3") else (None, None)
        assert len(counts) == w1.shape[0], (len(counts), w1.shape)
        outs = []
        for e, xs in enumerate(torch.split(x, counts)):  # every expert runs, even on 0 rows
            gate = F.linear(xs, w1[e], None if b1 is None else b1[e])
            up = None if w3 is None else F.linear(xs, w3[e], None if b3 is None else b3[e])
            outs.append(F.linear(self.act(gate, up), w2[e], None if b2 is None else b2[e]))
        return torch.cat(outs)

    def act(self, gate: torch.Tensor, up: torch.Tensor | None) -> torch.Tensor:
        """The activation between fc1 and fc2: silu(gate) * up (SwiGLU), gelu(gate) * up
        (GeGLU) or gelu(gate). A method of its own, so that recompute.modules moe_act can
        checkpoint it and discard its output (runtime/module_recompute.py)."""
        if self.mlp == MlpKind.SWIGLU:
            assert up is not None
            return F.silu(gate) * up
        if self.mlp == MlpKind.GEGLU:
            assert up is not None
            return F.gelu(gate, approximate="tanh") * up
        return F.gelu(gate)


def local_dispatch(experts: Experts, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """All experts on this rank: run them on the expert-sorted rows."""
    return experts(routed, counts.tolist())


def token_index_experts(positions: torch.Tensor, k: int, num_experts: int) -> torch.Tensor:
    """Fixed assignment (T, k) by sequence position p: experts e0, e0+1, ..., e0+k-1 (mod E)
    with e0 = (floor(p^2/3) + p) mod E, uneven on purpose so the experts' token counts differ
    (seq 64, E 8: 5 to 11 first choices per expert)."""
    e0 = (positions * positions // 3 + positions) % num_experts
    return (e0[:, None] + torch.arange(k, device=positions.device)) % num_experts


def capacity_mask(gates: torch.Tensor, chosen: torch.Tensor, seq_len: int, num_experts: int,
                  capacity_factor: float) -> torch.Tensor:
    """Which (token, slot) assignments an expert keeps (T, k), bool: of each sequence's s
    tokens an expert takes at most capacity = ceil(s * k * capacity_factor / E) (Megatron-Core's
    formula, moe/README.md "capacity = num_tokens_per_rank * topk * capacity_factor /
    num_experts", applied per sequence), the highest gates first (its "probs" drop policy;
    equal gates: the earlier token, then the earlier slot). Per sequence rather than per rank,
    so a token's fate does not depend on how dp, pp micro-batches, tp or ep split the batch."""
    t, k = chosen.shape
    cap = math.ceil(seq_len * k * capacity_factor / num_experts)
    flat_e = chosen.reshape(-1)
    group = torch.arange(t, device=chosen.device).repeat_interleave(k) // seq_len * num_experts \
        + flat_e  # (sequence, expert) of each slot
    by_gate = torch.argsort(-gates.detach().reshape(-1).float(), stable=True)
    order = by_gate[torch.argsort(group[by_gate], stable=True)]  # group, then gate descending
    counts = torch.bincount(group, minlength=int(group.max()) + 1 if group.numel() else 0)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel(), device=chosen.device) - first[group[order]]
    keep = torch.empty_like(flat_e, dtype=torch.bool)
    keep[order] = rank < cap
    return keep.view(t, k)


class MoE(nn.Module):
    """y = sum_j g_j(x) E_{i_j}(x) + shared(x) over the top-k experts i_j of router(x).

    Gates: softmax over the k selected logits (Mixtral: mistral-src `moe.py`, `weights =
    softmax(topk(gate_logits))`; Hugging Face Qwen3-MoE with norm_topk_prob=True computes the
    same softmax-then-top-k-then-renormalise). No auxiliary load-balancing loss is added.
    With router_aux_free, DeepSeek-V3's router instead (models/aux_free.py: sigmoid scores,
    experts by score plus a per-expert bias within the allowed groups, normalised gates); the
    gates of either are multiplied by routed_scaling_factor.
    """

    routes_tokens = True  # tensor_parallel: router and shared experts replicated over tp

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.top_k = moe.experts_per_token
        self.num_experts = moe.num_experts
        self.router_dtype = ROUTER_DTYPES[moe.router_dtype]
        self.capacity_factor = moe.capacity_factor
        """None: dropless; else each expert keeps at most its capacity per sequence."""
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=spec.bias)
        self.scale = moe.routed_scaling_factor
        self.groups, self.groups_per_token = moe.route_groups, moe.groups_per_token
        self.balance = ExpertBias(moe.num_experts, moe.router_bias_update_rate) \
            if moe.router_aux_free else None
        """router_aux_free: the load-balancing bias (a buffer) and this step's expert loads."""
        self.experts = Experts(spec)
        self.shared = None
        if moe.num_shared_experts:  # one MLP as wide as all shared experts (DeepSeekMoE §3.1)
            width = moe.num_shared_experts * moe.expert_ffn_hidden_size
            self.shared = FeedForward(spec.replace(ffn_hidden_size=width, moe=None))
        self.dispatch = local_dispatch
        """(experts, expert-sorted rows, per-expert counts (E,)) -> expert outputs, same rows;
        expert_parallel.apply_ep replaces it with the all-to-all dispatcher."""
        self.router_kind = "learned"
        self.context_parallel = None  # positions of a token-index router under cp
        self.tp_mesh = None
        """Set by apply_ep when ep * etp > 1 and tp > 1: each tp rank sends its 1/tp of the
        (tp-replicated) tokens to the experts, the expert outputs are all-gathered over tp."""

    def route(self, tokens: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gates (T, k) in the tokens' dtype and expert indices (T, k) of each token."""
        w = self.router.weight.to(self.router_dtype)
        b = None if self.router.bias is None else self.router.bias.to(self.router_dtype)
        logits = F.linear(tokens.to(self.router_dtype), w, b)  # (T, E)
        fixed = None
        if self.router_kind == "token-index":
            pos = torch.arange(tokens.shape[0], device=tokens.device) % seq_len
            if self.context_parallel is not None:
                pos = self.context_parallel.positions(seq_len, tokens.device)[pos]
            fixed = token_index_experts(pos, self.top_k, self.num_experts)
        if self.balance is not None:
            gates, chosen = sigmoid_route(logits, self.balance.bias, self.top_k, self.groups,
                                          self.groups_per_token, self.scale, fixed)
            self.balance.count(chosen)
            return gates.to(tokens.dtype), chosen
        chosen = fixed if fixed is not None else top_k_stable(logits.detach(), self.top_k)
        picked = logits.gather(-1, chosen)  # softmax in at least fp32, as Mixtral's
        wide = torch.promote_types(picked.dtype, torch.float32)
        gates = torch.softmax(picked, dim=-1, dtype=wide)
        if self.scale != 1.0:
            gates = gates * self.scale
        return gates.to(tokens.dtype), chosen

    def routed_outputs(self, tokens: torch.Tensor, chosen: torch.Tensor,
                       keep: torch.Tensor | None = None) -> torch.Tensor:
        """Expert outputs (T, k, h) of each token's k experts, before the gates; zeros for the
        slots `keep` drops (they are not sent to any expert)."""
        flat = chosen.reshape(-1)  # (T*k,) expert of each (token, slot)
        slots = None if keep is None else torch.nonzero(keep.reshape(-1)).squeeze(1)
        if slots is not None:
            flat = flat[slots]
        order = torch.argsort(flat, stable=True)  # grouped by expert, token order within
        counts = torch.bincount(flat, minlength=self.num_experts)
        rows = order if slots is None else slots[order]  # (token, slot) of each sorted row
        out = self.dispatch(self.experts, tokens[rows // self.top_k], counts)
        h = tokens.shape[-1]
        if slots is None:
            return out[torch.argsort(order)].view(-1, self.top_k, h)
        full = out.new_zeros(chosen.numel(), h).index_copy(0, rows, out)
        return full.view(-1, self.top_k, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)  # (T, h)
        gates, chosen = self.route(tokens, s)
        keep = None if self.capacity_factor is None else capacity_mask(
            gates, chosen, s, self.num_experts, self.capacity_factor)
        if self.tp_mesh is None:
            routed = self.routed_outputs(tokens, chosen, keep)
        else:  # experts folded over tp: this rank's 1/tp of the tokens, gathered afterwards
            rank, parts = self.tp_mesh.get_local_rank(), self.tp_mesh.size()
            part = _tp_chunk(tokens, self.tp_mesh)
            mine = chosen.tensor_split(parts)[rank]
            kept = None if keep is None else keep.tensor_split(parts)[rank]
            routed = _tp_gather(self.routed_outputs(part, mine, kept), self.tp_mesh)
        y = (routed * gates.unsqueeze(-1)).sum(dim=1)
        if self.shared is not None:
            y = y + self.shared(tokens)
        return y.view(b, s, h)


def _tp_chunk(x: torch.Tensor, tp_mesh) -> torch.Tensor:
    """This tp rank's rows of a tp-replicated x (T, h); backward all-gathers the gradient, so
    every tp rank again holds the whole (identical) input gradient."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    d = DTensor.from_local(x, tp_mesh, [Replicate()], run_check=False)
    return d.redistribute(tp_mesh, [Shard(0)]).to_local()


def _tp_gather(x: torch.Tensor, tp_mesh) -> torch.Tensor:
    """All tp ranks' rows (T, k, h) of x; backward keeps this rank's rows of the (tp-
    replicated) gradient, not a sum over tp."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    d = DTensor.from_local(x, tp_mesh, [Shard(0)], run_check=False)
    return d.redistribute(tp_mesh, [Replicate()]).to_local()


def set_router(model: nn.Module, kind: str) -> None:
    """Select the router of every MoE layer: learned (default) or token-index (tests)."""
    if kind not in ROUTERS:
        raise ValueError(f"router {kind!r}: choose one of {ROUTERS}")
    for module in model.modules():
        if isinstance(module, MoE):
            module.router_kind = kind
