"""Expert parallelism: routed experts sharded ep ways (and each split etp ways), tokens sent to
them with all-to-all.

Layout (Megatron-Core's "MoE parallel folding", megatron/core/parallel_state.py
initialize_model_parallel: the expert rank generator orders "tp-ep-dp-pp" with tp = the
expert TP size): per pipeline stage the dp*cp*tp ranks form an (expert-DP, ep, etp) grid, etp
innermost, expert-DP edp = dp*cp*tp/(ep*etp). The expert mesh ("pp", "edp_replicate",
"edp_shard", "ep", "etp") lays the same ranks out in that order, so with etp = tp the etp
groups are the tp groups.

- Each expert weight is a DTensor of its global shape (E, out, in) sharded Shard(0) over "ep"
  and, with etp > 1, Megatron-style over "etp" (Shoeybi et al. 2019, §3): w1/w3 column-wise
  (Shard(1), the FFN rows, and their biases), w2 row-wise (Shard(2), the FFN columns; its
  bias Replicate). DCP checkpoints reshard across EP and ETP degrees and the gradient norm
  (DTensor) counts every element once.
- Tokens: each rank sends its own tokens. Under tp > 1 the tp ranks hold the same tokens, so
  each sends its 1/tp of them and the outputs are all-gathered over tp (models/moe.py): every
  token reaches its experts once. With etp > 1, as Megatron-Core's MoEAlltoAllTokenDispatcher
  (megatron/core/transformer/moe/token_dispatcher.py: dispatch_postprocess gathers over the
  expert-TP group after the EP all-to-all, combine_preprocess reduce-scatters before the
  reverse one): after the ep all-to-all the etp ranks all-gather their rows, so each holds
  every row sent to its experts by its etp peers and computes its slice of the FFN on all of
  them; the partial outputs are summed and scattered back to the rank the rows came from (a
  reduce-scatter; w2's bias is in etp rank 0's partial sums only), then the reverse
  all-to-all. Chosen
  over splitting nothing (each etp rank sending the same tp-replicated tokens and
  all-reducing the outputs) because it is the one rule for every etp: with etp != tp the etp
  ranks hold different tokens (other dp or cp ranks), and it is the layout Megatron runs.
  The row counts differ per rank, so the gather and the scatter are `all_to_all_single`s
  with uneven splits (the same rows to every peer): gloo's all_gather refuses unequal sizes
  ("ProcessGroupGloo::allgather: invalid tensor size", torch 2.13, tried on 2 ranks).
- FSDP2 shards the expert weights over the expert-DP group (a mesh without ep or etp), the
  rest of the block over dp as before. Gradients are averaged over dp*cp for all parameters:
  an expert slice's gradient already sums the contributions of its ep x etp group's tokens
  (each token once), so the expert-DP reduction divides by dp*cp, not edp: FSDP2's default
  average over its own group would leave them ep*etp times too large (the planted bug
  ep-expert-grads-over-edp; torchtitan avoids the question by summing,
  set_gradient_divide_factor(1.0), and dividing the loss by the global token count). w2's
  bias, replicated over etp but added by etp rank 0 alone, has its gradient summed over etp
  in backward (SumGradOver: Megatron's copy_to_tensor_model_parallel_region, the "f"
  operator of Shoeybi et al. 2019, Fig. 3).
Dispatch (as torchtitan/distributed/expert_parallel.py): exchange per-expert counts with
`torch.distributed.all_to_all_single`, then the rows with it inside an autograd.Function whose
backward is the reverse all-to-all (what `_functional_collectives.all_to_all_single_autograd`
does, minus its lazily-waited result), and regroup by local expert.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoplan.plan import Offload, Precision, ReduceDtype
from autoplan.runtime.mesh import ParallelDims, with_world_timeout
from autoplan.runtime.models.moe import Experts, GroupedLinear, MoE

EXPERT_MESH_DIM_NAMES = ("pp", "edp_replicate", "edp_shard", "ep", "etp")


def build_expert_mesh(dims: ParallelDims, device_type: str):  # -> DeviceMesh
    """The expert mesh over the same ranks as the world mesh (mesh.build_mesh, tp innermost):
    dp*cp*tp split into (edp, ep, etp), edp replicated under ZeRO-0 and sharded under ZeRO >= 1."""
    from torch.distributed.device_mesh import init_device_mesh

    edp = dims.edp
    shape = (dims.pp, edp if dims.zero_stage == 0 else 1, 1 if dims.zero_stage == 0 else edp,
             dims.ep, dims.etp)
    return with_world_timeout(init_device_mesh(device_type, shape,
                                               mesh_dim_names=EXPERT_MESH_DIM_NAMES))


class AllToAllDispatch:
    """Send expert-sorted rows to the ranks holding their experts, run them, send them back;
    with etp > 1 gather the rows over etp first and reduce-scatter the partial outputs."""

    def __init__(self, ep_mesh, etp_mesh=None) -> None:
        self.group = ep_mesh.get_group()
        self.ep = ep_mesh.size()
        self.etp = 1 if etp_mesh is None else etp_mesh.size()
        self.etp_group = etp_mesh.get_group() if self.etp > 1 else None

    def __call__(self, experts: Experts, routed: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
        ep, n_local = self.ep, experts.num_experts // self.ep
        recv_counts = torch.empty_like(counts)  # [source rank][local expert]
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(ep, n_local).sum(1).tolist()
        recv = recv_counts.view(ep, n_local).sum(1).tolist()
        got = AllToAll.apply(routed, recv, send, self.group)
        if self.etp == 1:
            out = run_by_expert(experts, got, recv_counts, n_local)
        else:
            out = self._expert_tensor_parallel(experts, got, recv_counts, n_local)
        return AllToAll.apply(out, send, recv, self.group)

    def _expert_tensor_parallel(self, experts: Experts, got: torch.Tensor,
                                recv_counts: torch.Tensor, n_local: int) -> torch.Tensor:
        """This rank's rows `got` ((ep source, local expert) order) through the etp-split
        experts: gathered over etp, the partial outputs summed back onto their rank."""
        etp, mine = self.etp, got.shape[0]
        peer_counts = [torch.empty_like(recv_counts) for _ in range(etp)]
        dist.all_gather(peer_counts, recv_counts, group=self.etp_group)
        sizes = [int(c.sum()) for c in peer_counts]
        rows = AllToAll.apply(got.repeat(etp, 1), sizes, [mine] * etp, self.etp_group)
        partial = run_by_expert(experts, rows, torch.cat(peer_counts), n_local)
        out = AllToAll.apply(partial, [mine] * etp, sizes, self.etp_group)
        return sum_partials(out.view(etp, mine, -1))


def sum_partials(parts: torch.Tensor) -> torch.Tensor:
    """The reduce of the reduce-scatter: (etp, rows, h) partial outputs of this rank's rows, one
    per etp rank's slice of the FFN, summed to (rows, h)."""
    return parts.sum(0)


class PartialBias:
    """w2's bias under etp > 1 (Experts.partial_bias): etp rank 0 adds it to its partial sums,
    the others add zero, so the sum over etp holds it once (Megatron's row-parallel linear adds
    its bias after the reduction); its gradient, which only etp rank 0 gets, is summed over
    etp (SumGradOver) so that every etp rank holds the whole gradient of the replicated bias."""

    def __init__(self, etp_mesh) -> None:
        self.group = etp_mesh.get_group()
        self.first = etp_mesh.get_local_rank() == 0

    def __call__(self, bias: torch.Tensor) -> torch.Tensor:
        bias = SumGradOver.apply(bias, self.group)
        return bias if self.first else bias * 0.0


def run_by_expert(experts: Experts, rows: torch.Tensor, seg_counts: torch.Tensor,
                  n_local: int) -> torch.Tensor:
    """Experts on rows that arrive grouped by (source, local expert), seg_counts[source *
    n_local + e] rows each: regrouped by (local expert, source), run, put back in order."""
    sources = seg_counts.numel() // n_local
    segment = torch.repeat_interleave(
        torch.arange(seg_counts.numel(), device=seg_counts.device), seg_counts)
    by_expert = torch.argsort((segment % n_local) * sources + segment // n_local, stable=True)
    per_expert = seg_counts.view(sources, n_local).sum(0).tolist()
    out = experts(rows[by_expert], per_expert)
    return out[torch.argsort(by_expert)]


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


class SumGradOver(torch.autograd.Function):
    """Identity forward; backward all-reduces (sums) the gradient over `group`: a weight
    replicated over the group but applied to different rows on each rank."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def moe_blocks(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def apply_ep(model: nn.Module, expert_mesh, tp_mesh=None) -> None:
    """Shard every MoE layer's expert weights over the expert mesh's ep (dim 0) and, with etp >
    1, etp (the FFN dimension) dimensions, on the meta device, and route its tokens through the
    all-to-all dispatcher; `tp_mesh` (tp > 1): the tp ranks split the tokens between them."""
    from torch.distributed.tensor import distribute_tensor

    _sac_ignores_profiler_ops()
    ep_mesh, etp_mesh = expert_mesh["ep"], expert_mesh["etp"]
    split = etp_mesh.size() > 1
    mesh = expert_mesh["ep", "etp"] if split else ep_mesh
    dispatch = AllToAllDispatch(ep_mesh, etp_mesh)
    for moe in moe_blocks(model):
        assert moe.num_experts % ep_mesh.size() == 0, (moe.num_experts, ep_mesh.size())
        for kind, lin in moe.experts.named_children():
            if not isinstance(lin, GroupedLinear):
                continue
            for name, p in list(lin.named_parameters(recurse=False)):
                placements = expert_placements(kind, name, split)
                lin.register_parameter(
                    name, nn.Parameter(distribute_tensor(p, mesh, placements)))
        moe.experts.partial_bias = PartialBias(etp_mesh) if split else None
        moe.dispatch = dispatch
        moe.tp_mesh = tp_mesh


def expert_placements(linear: str, param: str, split: bool) -> list:
    """DTensor placements of expert weight `linear`.`param` (w1/w3 column-parallel: their
    (E, f, h) weight and (E, f) bias split on f; w2 row-parallel: its (E, h, f) weight split
    on f, its bias whole); over (ep, etp) when `split`, else over ep alone."""
    from torch.distributed.tensor import Replicate, Shard

    if not split:
        return [Shard(0)]
    if linear == "w2":
        return [Shard(0), Shard(2) if param == "weight" else Replicate()]
    return [Shard(0), Shard(1)]


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
                      offload: Offload, grad_reduce: ReduceDtype | None = None) -> None:
    """fully_shard each MoE layer's experts over the expert-DP group (before the blocks are
    wrapped, so the blocks' FSDP leaves them alone; a mesh without ep or etp), gradients divided
    by dp*cp and reduced in the plan's grad_reduce_dtype, as the blocks' are."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from autoplan.runtime.data_parallel import reduce_dtype, reshard_after_forward
    from autoplan.runtime.offload import offload_policy

    mp = MixedPrecisionPolicy()
    if precision != Precision.FP32:  # as data_parallel.apply_fsdp
        low = torch.float16 if precision == Precision.FP16 else torch.bfloat16
        mp = MixedPrecisionPolicy(param_dtype=low,
                                  reduce_dtype=reduce_dtype(precision, grad_reduce))
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
