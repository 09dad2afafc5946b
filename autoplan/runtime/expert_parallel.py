"""Expert parallelism: routed experts sharded ep ways, tokens sent to them with all-to-all.

Layout (Megatron-Core's "MoE parallel folding", megatron/core/parallel_state.py
initialize_model_parallel, with ETP = 1): per pipeline stage the dp*cp*tp ranks form an
(expert-DP, ep) grid, ep innermost, expert-DP edp = dp*cp*tp/ep. The expert mesh
("pp", "edp_replicate", "edp_shard", "ep") lays the same ranks out in that order.

- Each expert weight is a DTensor of its global shape (E, out, in) sharded Shard(0) over "ep",
  so checkpoints (DCP) reshard across EP degrees and the gradient norm sums over every expert.
- Expert weights are never split over tp (ETP = 1). The tp ranks hold the same tokens; with
  ep > 1 each sends its 1/tp of them to the experts and the outputs are all-gathered over tp
  (models/moe.py), so every token reaches its experts once. The router and shared experts
  run on all tokens, replicated over tp.
- FSDP2 shards the expert weights over the expert-DP group (a mesh without ep), the rest of
  the block over dp as before. Gradients are averaged over dp*cp for all parameters: an
  expert's gradient already sums the contributions of its ep group's tokens (each token once),
  so the expert-DP reduction divides by dp*cp, not edp: FSDP2's default average over its own
  group would leave them ep times too large (the planted bug ep-expert-grads-over-edp;
  torchtitan avoids the question by summing, set_gradient_divide_factor(1.0), and dividing
  the loss by the global token count).
Dispatch (as torchtitan/distributed/expert_parallel.py): exchange per-expert counts with
`torch.distributed.all_to_all_single`, then the rows with it inside an autograd.Function whose
backward is the reverse all-to-all (what `_functional_collectives.all_to_all_single_autograd`
does, minus its lazily-waited result), and regroup by local expert.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoplan.plan import Offload, Precision
from autoplan.runtime.mesh import ParallelDims
from autoplan.runtime.models.moe import Experts, GroupedLinear, MoE

EXPERT_MESH_DIM_NAMES = ("pp", "edp_replicate", "edp_shard", "ep")


def build_expert_mesh(dims: ParallelDims, device_type: str):  # -> DeviceMesh
    """The expert mesh over the same ranks as the world mesh (mesh.build_mesh, tp innermost):
    dp*cp*tp split into (edp, ep), edp replicated under ZeRO-0 and sharded under ZeRO >= 1."""
    from torch.distributed.device_mesh import init_device_mesh

    edp = dims.dp * dims.cp * dims.tp // dims.ep
    shape = (dims.pp, edp if dims.zero_stage == 0 else 1, 1 if dims.zero_stage == 0 else edp,
             dims.ep)
    return init_device_mesh(device_type, shape, mesh_dim_names=EXPERT_MESH_DIM_NAMES)


class AllToAllDispatch:
    """Send expert-sorted rows to the ranks holding their experts, run them, send them back."""

    def __init__(self, ep_mesh) -> None:
        self.group = ep_mesh.get_group()
        self.ep = ep_mesh.size()

    def __call__(self, experts: Experts, routed: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
        ep, n_local = self.ep, experts.num_experts // self.ep
        recv_counts = torch.empty_like(counts)  # [source rank][local expert]
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(ep, n_local).sum(1).tolist()
        recv = recv_counts.view(ep, n_local).sum(1).tolist()
        got = AllToAll.apply(routed, recv, send, self.group)
        # rows arrive grouped by (source, local expert); regroup by (local expert, source)
        segment = torch.repeat_interleave(torch.arange(ep * n_local), recv_counts)
        by_expert = torch.argsort((segment % n_local) * ep + segment // n_local, stable=True)
        per_expert = recv_counts.view(ep, n_local).sum(0).tolist()
        out = experts(got[by_expert], per_expert)
        out = out[torch.argsort(by_expert)]
        return AllToAll.apply(out, send, recv, self.group)


class AllToAll(torch.autograd.Function):
    """all_to_all_single of rows (out_splits received, in_splits sent); backward sends the
    gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        dx = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(dx, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return dx, None, None, None


def moe_blocks(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def apply_ep(model: nn.Module, ep_mesh, tp_mesh=None) -> None:
    """Shard every MoE layer's expert weights Shard(0) over `ep_mesh` (on the meta device) and
    route its tokens through the all-to-all dispatcher; `tp_mesh` (tp > 1): the tp ranks
    split the tokens between them."""
    from torch.distributed.tensor import Shard, distribute_tensor

    _sac_ignores_profiler_ops()
    dispatch = AllToAllDispatch(ep_mesh)
    for moe in moe_blocks(model):
        assert moe.num_experts % ep_mesh.size() == 0, (moe.num_experts, ep_mesh.size())
        for lin in moe.experts.modules():
            if isinstance(lin, GroupedLinear):
                for name, p in list(lin.named_parameters(recurse=False)):
                    lin.register_parameter(
                        name, nn.Parameter(distribute_tensor(p, ep_mesh, [Shard(0)])))
        moe.dispatch = dispatch
        moe.tp_mesh = tp_mesh


def _sac_ignores_profiler_ops() -> None:
    """Selective recompute (torch.utils.checkpoint's SAC) counts every op of a block and
    expects the same ops again on recompute; the experts' FSDP2 hooks inside the block open
    more `record_function` ranges on recompute than in forward, which SAC refused ("invocation
    index 2 ... not found in storage", torch 2.13). Profiler ranges carry no tensors, so SAC
    may pass them through like its other ignored ops (checked by the EP parity rows with
    selective recompute). Process-wide; done only when expert parallelism is used."""
    import torch.utils.checkpoint as checkpoint

    checkpoint.SAC_IGNORED_OPS |= {torch.ops.profiler._record_function_enter_new.default,
                                   torch.ops.profiler._record_function_exit._RecordFunction}


def moe_tp_plan(plan: dict[str, object], sequence_parallel: bool) -> dict[str, object]:
    """A block's tensor-parallel plan with a MoE MLP: the MoE is replicated over tp and sees
    the whole (gathered) sequence as a plain tensor; its output is cut back to the residual's
    layout (sequence-sharded under sequence parallelism)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    act = Shard(1) if sequence_parallel else Replicate()
    plan = {k: v for k, v in plan.items() if not k.startswith("feed_forward")}
    plan["feed_forward"] = PrepareModuleInputOutput(
        input_layouts=(act,), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(act,), use_local_output=True,
    )
    return plan


def apply_expert_fsdp(model: nn.Module, expert_mesh, dims: ParallelDims, precision: Precision,
                      offload: Offload) -> None:
    """fully_shard each MoE layer's experts over the expert-DP group (before the blocks are
    wrapped, so the blocks' FSDP leaves them alone), gradients divided by dp*cp."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from autoplan.runtime.data_parallel import reshard_after_forward
    from autoplan.runtime.offload import offload_policy

    mp = MixedPrecisionPolicy()
    if precision != Precision.FP32:  # as data_parallel.apply_fsdp
        low = torch.float16 if precision == Precision.FP16 else torch.bfloat16
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    mesh = (expert_mesh["edp_replicate", "edp_shard"] if dims.zero_stage == 0
            else expert_mesh["edp_shard"])
    for moe in moe_blocks(model):
        fully_shard(moe.experts, mesh=mesh, mp_policy=mp, offload_policy=offload_policy(offload),
                    reshard_after_forward=reshard_after_forward(dims.zero_stage))
        moe.experts.set_gradient_divide_factor(float(dims.dp * dims.cp))
        if expert_mesh.device_type != "cuda" and expert_mesh["edp_shard"].size() > 1:
            # gloo has no PREMUL_SUM: sum, then divide. Not with a 1-rank shard group: torch
            # 2.13's foreach_reduce then divides twice (its 1-rank copy divides too).
            moe.experts.set_force_sum_reduction_for_comms(True)
