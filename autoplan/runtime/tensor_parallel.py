"""Megatron-style tensor parallelism and sequence parallelism with DTensor (parallelize_module).

Per block: q/k/v and w1/w3 are column-parallel, wo and w2 row-parallel, so one all-reduce
(or, with sequence parallelism, one all-gather before and one reduce-scatter after) per
attention and per MLP in forward and again in backward (Shoeybi et al. 2019; Korthikanti et al.
2022). The token embedding is vocab-parallel (row-wise), the head column-parallel; with
`loss_parallel` the logits stay sharded over the vocabulary and the cross entropy is computed
on the shards. Norms become SequenceParallel (replicated weights, sequence-sharded activations).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


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
        parallelize_module(block, tp_mesh, plan)
