"""Megatron-style tensor parallelism and sequence parallelism with DTensor (parallelize_module).

Per block: q/k/v and w1/w3 are column-parallel, wo and w2 row-parallel, so one all-reduce
(or, with sequence parallelism, one all-gather before and one reduce-scatter after) per
attention and per MLP in forward and again in backward (Shoeybi et al. 2019; Korthikanti et al.
2022). The token embedding is vocab-parallel (row-wise), the head column-parallel; with
`loss_parallel` the logits stay sharded over the vocabulary and the cross entropy is computed
on the shards. Norms become SequenceParallel (replicated weights, sequence-sharded activations);
QK-norm's per-head norms stay whole on every rank and normalise its own heads (qk_norm_plan).
Multi-head latent attention shards its up projections by heads and replicates its down
projections (mla_plan).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autoplan.runtime.models.mla import MultiHeadLatentAttention


def block_plan(sequence_parallel: bool, swiglu: bool) -> dict[str, object]:
    """parallelize_module plan of one Block (keys are FQNs inside the block)."""
    act = Shard(1) if sequence_parallel else Replicate()  # activation layout between sub-layers
    plan: dict[str, object] = {
        "attention": PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=act),
        "feed_forward": PrepareModuleInput(
            input_layouts=(act,), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=act),
    }
    if swiglu:
        plan["feed_forward.w3"] = ColwiseParallel()
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan


class ReplicateParallel(ParallelStyle):
    """Weights replicated over tp, inputs and outputs replicated DTensors (torchtitan's
    NoParallel, torchtitan/distributed/tensor_parallel.py): a layer every tp rank runs whole on
    the same input, whose weight gradients DTensor then sums over tp (each rank's share of the
    heads downstream contributes a partial gradient)."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def replicated_input(mod, inputs, mesh):
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
            return (x, *inputs[1:])

        return distribute_module(module, device_mesh, None, replicated_input)


def mla_plan(plan: dict[str, object], q_lora: bool) -> dict[str, object]:
    """A block's plan with multi-head latent attention (models/mla.py), as Megatron-Core's
    MLASelfAttention (megatron/core/transformer/multi_latent_attention.py): the up projections
    wq / wq_b and wkv_b column-parallel (whole heads per rank), wo row-parallel, the down
    projections wq_a / wkv_a (with the shared rotary key) and the latent norms replicated.
    They run on the whole gathered sequence (Megatron runs them sequence-sharded and gathers
    after); their outputs stay DTensors so their gradients are summed over tp."""
    plan = {k: v for k, v in plan.items() if k not in ("attention.wq", "attention.wk",
                                                         "attention.wv")}
    plan["attention.wkv_a"] = ReplicateParallel()
    plan["attention.kv_norm"] = ReplicateParallel()
    plan["attention.wkv_b"] = ColwiseParallel()
    if q_lora:
        plan["attention.wq_a"] = ReplicateParallel()
        plan["attention.q_norm"] = ReplicateParallel()
        plan["attention.wq_b"] = ColwiseParallel()
    else:
        plan["attention.wq"] = ColwiseParallel()
    return plan


def qk_norm_plan(plan: dict[str, object]) -> dict[str, object]:
    """A block's plan with QK-norm (model.qk_norm; models/layers.Attention): q_norm and k_norm
    replicated over tp, their input taken as the rank's heads of q and k (b, s, local heads,
    head_dim: sharded on dim 2, the heads), so their weight gradient, each rank's partial sum
    over its heads, is summed over tp. torchtitan's qwen3 plans them the same way
    (SequenceParallel(sequence_dim=2) on attention.q_norm / k_norm, use_local_output)."""
    return {**plan, **{f"attention.{n}": SequenceParallel(sequence_dim=2, use_local_output=True)
                       for n in ("q_norm", "k_norm")}}


def head_plan(sequence_parallel: bool, loss_parallel: bool, has_embed: bool, has_head: bool):
    """Plan of the model's embedding / final norm / output head, where this stage has them."""
    act = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    if has_embed:
        # vocab-parallel lookup, summed to a full (b, s, h); learned positions are added on it
        plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:
            plan["embed"] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(1)
            )
    if has_head:
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        plan["output"] = ColwiseParallel(
            input_layouts=act,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return plan


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Shard `model` (a Transformer or a pipeline stage of one) in place over `tp_mesh`."""
    parallelize_module(
        model,
        tp_mesh,
        head_plan(
            sequence_parallel,
            loss_parallel,
            has_embed=getattr(model, "embed", None) is not None,
            has_head=getattr(model, "output", None) is not None,
        ),
    )
    for block in model.layers.values():
        swiglu = hasattr(block.feed_forward, "w3")
        plan = block_plan(sequence_parallel, swiglu)
        if getattr(block.feed_forward, "routes_tokens", False):  # MoE: replicated over tp
            from autoplan.runtime.expert_parallel import moe_tp_plan

            plan = moe_tp_plan(plan, sequence_parallel)
        if isinstance(block.attention, MultiHeadLatentAttention):
            plan = mla_plan(plan, q_lora=block.attention.mla.q_lora_rank is not None)
        elif getattr(block.attention, "qk_norm", False):
            plan = qk_norm_plan(plan)
        parallelize_module(block, tp_mesh, plan)
