"""Test-only planted parallelism bugs, applied by monkeypatching inside the forked ranks.

Each entry breaks one piece the way real bugs do; the parity check must catch every one.
Nothing here is reachable from production code paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


def _tp_missing_allreduce(mp: pytest.MonkeyPatch) -> None:
    """Row-parallel attention output used as the local partial sum (no all-reduce)."""
    from torch.distributed.tensor.parallel import RowwiseParallel

    from autoplan.runtime import tensor_parallel

    class NoReduce(RowwiseParallel):
        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            return outputs.to_local()

    original = tensor_parallel.block_plan

    def block_plan(sequence_parallel, swiglu):
        plan = original(sequence_parallel, swiglu)
        plan["attention.wo"] = NoReduce()
        return plan

    mp.setattr(tensor_parallel, "block_plan", block_plan)


def _dp_sum_not_average(mp: pytest.MonkeyPatch) -> None:
    """Gradients summed over dp instead of averaged (what a SUM reduce-scatter leaves)."""
    import torch

    from autoplan.runtime.trainer import Trainer

    original = Trainer.forward_backward

    def forward_backward(self, inputs, labels):
        out = original(self, inputs, labels)
        with torch.no_grad():
            for part in self.pm.parts:
                for p in part.parameters():
                    if p.grad is not None:
                        p.grad.mul_(self.pm.dims.dp)
        return out

    mp.setattr(Trainer, "forward_backward", forward_backward)


def _pp_drop_microbatch_grad(mp: pytest.MonkeyPatch) -> None:
    """The last stage's loss of the first micro-batch of every step carries no gradient."""
    from autoplan.runtime import parallelize

    original = parallelize.cross_entropy
    calls = {"n": 0}

    def cross_entropy(logits, labels):
        loss = original(logits, labels)
        calls["n"] += 1
        if calls["n"] % 4 == 1:  # 4 micro-batches per step in the test plan
            return loss.detach() + 0.0 * loss
        return loss

    mp.setattr(parallelize, "cross_entropy", cross_entropy)


def _sp_wrong_gather(mp: pytest.MonkeyPatch) -> None:
    """Sequence parallelism without the all-gather before attention: each rank attends within
    its own sequence chunk (the row-parallel output is all-reduced, so shapes still fit)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel

    from autoplan.runtime import tensor_parallel

    original = tensor_parallel.block_plan

    def block_plan(sequence_parallel, swiglu):
        plan = original(sequence_parallel, swiglu)
        plan["attention"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Shard(1),),
                                               use_local_output=True)
        plan["attention.wo"] = RowwiseParallel(output_layouts=Replicate())
        return plan

    mp.setattr(tensor_parallel, "block_plan", block_plan)


def _zero_stale_grads(mp: pytest.MonkeyPatch) -> None:
    """The optimizer updates the sharded parameters with the previous step's gradients."""
    from autoplan.runtime import trainer

    original = trainer.build_optimizer

    def build_optimizer(module, cfg):
        opt = original(module, cfg)
        step, prev = opt.step, {}

        def stale_step(*args, **kwargs):
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    current = p.grad.detach().clone()
                    if p in prev:
                        p.grad.copy_(prev[p])
                    prev[p] = current
            return step(*args, **kwargs)

        opt.step = stale_step
        return opt

    mp.setattr(trainer, "build_optimizer", build_optimizer)


def _recompute_fresh_rng(mp: pytest.MonkeyPatch) -> None:
    """Recomputation does not restore the RNG state: dropout masks differ from the forward's."""
    from autoplan.runtime import recompute

    original = recompute.checkpoint_kwargs

    def checkpoint_kwargs(policy):
        kwargs = original(policy)
        kwargs["preserve_rng_state"] = False
        return kwargs

    mp.setattr(recompute, "checkpoint_kwargs", checkpoint_kwargs)


def _cp_kv_rank_order(mp: pytest.MonkeyPatch) -> None:
    """Context parallelism uses the all-gathered K/V in rank order (rank 0's chunks 0 and
    2cp-1, then rank 1's, ...) without restoring sequence order; masks assume sequence order."""
    import torch

    from autoplan.runtime.context_parallel import LoadBalancedLayout

    def natural_order(self, local_len, device=None):
        return torch.arange(local_len * self.cp, device=device)

    mp.setattr(LoadBalancedLayout, "natural_order", natural_order)


def _cp_position_off_by_one(mp: pytest.MonkeyPatch) -> None:
    """Each cp rank's second chunk is given positions one token early (learned positions and
    RoPE see the wrong offset; a shift of every position alike would be harmless to RoPE)."""
    from autoplan.runtime.context_parallel import LoadBalancedLayout

    original = LoadBalancedLayout.positions

    def positions(self, local_len, device=None):
        pos = original(self, local_len, device).clone()
        pos[local_len // 2 :] -= 1
        return pos

    mp.setattr(LoadBalancedLayout, "positions", positions)


def _pp_tied_no_grad_sync(mp: pytest.MonkeyPatch) -> None:
    """Tied embeddings under pp: the first and last stages' copies keep their own gradients
    (no sum over the embedding group), so the two copies drift apart."""
    from autoplan.runtime.tied_embeddings import TiedEmbeddings

    mp.setattr(TiedEmbeddings, "sync_grads", lambda self: None)


BUGS = {
    "tp-missing-allreduce": _tp_missing_allreduce,
    "dp-sum-not-average": _dp_sum_not_average,
    "pp-drop-microbatch-grad": _pp_drop_microbatch_grad,
    "sp-wrong-gather": _sp_wrong_gather,
    "zero-stale-grads": _zero_stale_grads,
    "recompute-fresh-rng": _recompute_fresh_rng,
    "pp-tied-no-grad-sync": _pp_tied_no_grad_sync,
    "cp-kv-rank-order": _cp_kv_rank_order,
    "cp-position-off-by-one": _cp_position_off_by_one,
}


def _ep_no_regroup(mp: pytest.MonkeyPatch) -> None:
    """Expert parallelism: the rows an all-to-all delivers (grouped by source rank, then by
    expert) are fed to the experts as if grouped by expert, so tokens meet the wrong experts."""
    import torch

    from autoplan.runtime import expert_parallel

    def dispatch(self, experts, routed, counts):
        ep, n_local = self.ep, experts.num_experts // self.ep
        recv_counts = torch.empty_like(counts)
        torch.distributed.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(ep, n_local).sum(1).tolist()
        recv = recv_counts.view(ep, n_local).sum(1).tolist()
        got = expert_parallel.AllToAll.apply(routed, recv, send, self.group)
        out = experts(got, recv_counts.view(ep, n_local).sum(0).tolist())
        return expert_parallel.AllToAll.apply(out, send, recv, self.group)

    mp.setattr(expert_parallel.AllToAllDispatch, "__call__", dispatch)


def _ep_expert_grads_over_edp(mp: pytest.MonkeyPatch) -> None:
    """Expert gradients averaged over the expert-DP group only (FSDP2's default divide factor)
    instead of over dp*cp: ep times too large."""
    from autoplan.runtime import expert_parallel
    from autoplan.runtime.models.moe import Experts

    original = expert_parallel.apply_expert_fsdp

    def apply_expert_fsdp(model, expert_mesh, dims, precision, offload, *rest):
        original(model, expert_mesh, dims, precision, offload, *rest)
        for m in model.modules():
            if isinstance(m, Experts):
                mesh = m.w1.weight.device_mesh  # the (expert-DP, ep) spmd mesh
                m.set_gradient_divide_factor(float(mesh.size() // dims.ep))

    mp.setattr(expert_parallel, "apply_expert_fsdp", apply_expert_fsdp)


def _moe_capacity_keeps_lowest_gates(mp: pytest.MonkeyPatch) -> None:
    """Token dropping that keeps each expert's lowest gates instead of its highest (the
    capacity mask ranks the negated gates)."""
    from autoplan.runtime.models import moe

    original = moe.capacity_mask
    mp.setattr(moe, "capacity_mask", lambda gates, *rest: original(-gates, *rest))


def _etp_partials_not_summed(mp: pytest.MonkeyPatch) -> None:
    """Expert tensor parallelism: the reduce-scatter's sum left out, so every row keeps etp rank
    0's partial output alone (its slice of the FFN, and w2's bias)."""
    from autoplan.runtime import expert_parallel

    mp.setattr(expert_parallel, "sum_partials", lambda parts: parts[0])


def _etp_bias_grad_not_summed(mp: pytest.MonkeyPatch) -> None:
    """Expert tensor parallelism: w2's bias gradient not summed over etp, so the etp ranks other
    than 0 (which add none of it) keep a zero gradient for the replicated bias."""
    from autoplan.runtime import expert_parallel

    mp.setattr(expert_parallel.SumGradOver, "backward", staticmethod(lambda ctx, g: (g, None)))


MOE_BUGS = {
    "ep-no-regroup": _ep_no_regroup,
    "ep-expert-grads-over-edp": _ep_expert_grads_over_edp,
    "moe-capacity-keeps-lowest-gates": _moe_capacity_keeps_lowest_gates,
    "etp-partials-not-summed": _etp_partials_not_summed,
    "etp-bias-grad-not-summed": _etp_bias_grad_not_summed,
}
"""Expert-parallel bugs, checked by tests/dist/test_moe_parity.py."""


def _hsdp_no_replicate_allreduce(mp: pytest.MonkeyPatch) -> None:
    """HSDP without the all-reduce across replicas: FSDP2 is given only the dp_shard mesh, so
    each shard group averages its own gradients and the replica groups drift apart."""
    from autoplan.runtime import data_parallel

    original = data_parallel.fsdp_mesh

    def fsdp_mesh(world_mesh, dims):
        mesh = original(world_mesh, dims)
        return mesh["dp_shard"] if dims.hsdp and mesh.ndim == 2 else mesh

    mp.setattr(data_parallel, "fsdp_mesh", fsdp_mesh)


BUGS["hsdp-no-replicate-allreduce"] = _hsdp_no_replicate_allreduce


def _reduce_dtype_ignored(mp: pytest.MonkeyPatch) -> None:
    """grad_reduce_dtype=bf16 ignored: gradients reduced in fp32 anyway."""
    import torch

    from autoplan.runtime import data_parallel

    mp.setattr(data_parallel, "reduce_dtype", lambda precision, grad_reduce: torch.float32)


DTYPE_BUGS = {"reduce-dtype-ignored": _reduce_dtype_ignored}
"""Caught by the dtype on the wire (tests/dist/test_grad_reduce.py), not by parity."""


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        {**BUGS, **MOE_BUGS, **DTYPE_BUGS}[name](mp)
        yield
