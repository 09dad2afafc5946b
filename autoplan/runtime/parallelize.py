"""parallelize(): build the model for one rank of a plan, applying each technique in one order.

Order (torchtitan's parallelize_llama, torchtitan/models/llama3/infra/parallelize.py; shown to
compose on gloo by the parity table in tests/dist/test_parity.py):

1. build the whole model on the meta device (no memory);
2. pipeline split: keep this pp rank's stage(s), deleting the other modules (FQNs unchanged);
3. per stage: fp8 Linear layers (torchao; fp8 plans on CUDA only), tensor/sequence
   parallelism (DTensor), then context parallelism (attention and positions hooked to the cp
   group), then expert parallelism (MoE experts sharded over ep, tokens sent by all-to-all),
   then activation recomputation (checkpointed blocks, groups, modules), then FSDP2 fully_shard
   (ZeRO-1/2/3, bf16, offload; over dp x cp; MoE experts first, over the expert-DP group);
4. materialise on the device and load the deterministic, layout-independent initial weights;
5. DDP for pure data parallelism (it needs real tensors);
6. pipeline stages and schedule (pp > 1).
The optimizer is built last, by the trainer, over the resulting parameters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, Precision
from autoplan.runtime import (
    context_parallel,
    data_parallel,
    expert_parallel,
    float8,
    pipeline_parallel,
    recompute,
    tensor_parallel,
)
from autoplan.runtime.loss_scaling import LossScaler
from autoplan.runtime.mesh import ParallelDims, coordinate, pg_timeout
from autoplan.runtime.models.init import materialize_and_init
from autoplan.runtime.models.layers import set_attention
from autoplan.runtime.models.moe import set_router
from autoplan.runtime.models.transformer import build_meta_model, vocab_rows
from autoplan.runtime.offload import host_optimizer
from autoplan.runtime.tied_embeddings import TiedEmbeddings, retie

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeOptions:
    """Knobs of the runtime that are not part of a plan."""

    seed: int = 0
    """Seeds the initial weights (per FQN) and the per-step dropout RNG."""
    dropout: float = 0.0
    """Residual dropout probability (0 for parity runs)."""
    loss_parallel: bool = True
    """With tp > 1, keep the logits vocab-sharded and compute the loss on the shards."""
    pg_timeout_s: float = 60.0
    """Timeout of the process groups parallelize() creates (tied embeddings under pp > 2)."""
    moe_router: str = "learned"
    """MoE layers' router: learned, or token-index (a fixed assignment for parity tests)."""


@dataclass
class ParallelModel:
    """This rank's share of the model and how to run it; built by parallelize()."""

    dims: ParallelDims
    mesh: object
    parts: list[nn.Module]
    """Model chunks held by this rank (one unless vpp > 1 or zero-bubble V)."""
    stage_indices: list[int]
    num_stages: int
    n_microbatches: int
    local_batch_size: int
    loss_parallel: bool
    ddp: bool
    fsdp: bool
    schedule: object | None = None
    cp_layout: context_parallel.LoadBalancedLayout | None = None
    """With cp > 1, which sequence chunks this rank's inputs and labels keep."""
    tie_embeddings: bool = False
    """The head uses the embedding's weight (checkpoints name it embed.tok.weight only)."""
    tied: TiedEmbeddings | None = None
    """pp > 1 with tied embeddings: the copies whose gradients are summed after backward."""
    loss_scaler: LossScaler | None = None
    """fp16: dynamic loss scaling with one skip decision for the whole job."""
    host_optimizer: bool = False
    """offload.optimizer without offload.params: the optimizer steps on host copies."""
    loss_fn: object = None
    """(logits, labels) -> mean loss over the real vocabulary (loss_function)."""
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy; logits (b, s, V) possibly vocab-sharded, labels (b, s)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def mask_padded_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over the real vocabulary only: the padding columns sliced away, or, on
    vocab-sharded logits (loss_parallel), set to -inf on their shard, which gives them zero
    probability and zero gradient, so the loss equals the unpadded model's."""
    from torch.distributed.tensor import DTensor

    if not isinstance(logits, DTensor):
        return logits[..., :vocab_size]
    (placement,) = logits.placements  # the 1-D tp mesh
    if not placement.is_shard() or placement.dim not in (-1, logits.ndim - 1):
        return mask_padded_logits(logits.full_tensor(), vocab_size)
    local = logits.to_local()
    width = local.shape[-1]  # padded rows are a multiple of tp: equal shards
    offset = logits.device_mesh.get_local_rank() * width
    pad = torch.arange(offset, offset + width, device=local.device) >= vocab_size
    local = local.masked_fill(pad, float("-inf"))
    return DTensor.from_local(local, logits.device_mesh, logits.placements,
                              shape=logits.shape, stride=logits.stride())


def loss_function(vocab_size: int, rows: int):
    """cross_entropy over the real vocabulary of a model whose head has `rows` >= vocab_size
    outputs (the padded vocabulary)."""
    if rows == vocab_size:
        return cross_entropy

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cross_entropy(mask_padded_logits(logits, vocab_size), labels)

    return loss


def parallelize(
    plan: Plan, spec: ModelSpec, mesh, device: torch.device, options: RuntimeOptions
) -> ParallelModel:
    """This rank's model chunks for `plan` on `mesh` (see the module docstring for the order)."""
    dims = ParallelDims.from_plan(plan)
    local_batch = plan.batch.global_batch_size // dims.dp
    n_micro = local_batch // plan.batch.micro_batch_size
    loss_parallel = dims.tp > 1 and options.loss_parallel
    meta = build_meta_model(spec, options.dropout, dims.tp)  # 1
    set_attention(meta, plan.attention, device.type)  # CPU: 16-bit cores in fp32 (its traits)
    set_router(meta, options.moe_router)

    num_stages = dims.pp * plan.pipeline.vpp if dims.pp > 1 else 1  # 2
    if dims.pp > 1:
        counts = pipeline_parallel.layers_per_stage(
            spec.num_layers, num_stages, plan.pipeline.layers_per_stage
        )
        indices = pipeline_parallel.stage_indices(coordinate(mesh, "pp"), dims.pp, plan.pipeline)
        parts = [pipeline_parallel.split_stage(meta, i, counts) for i in indices]
    else:
        indices, parts = [0], [meta]

    # expert parallelism needs FSDP2's per-group reductions (experts over expert-DP only)
    ddp = data_parallel.uses_ddp(dims, plan.precision, plan.offload)
    fsdp = data_parallel.uses_fsdp(dims, plan.precision, plan.offload)
    expert_mesh = (expert_parallel.build_expert_mesh(dims, device.type)
                   if dims.experts_sharded else None)
    for part in parts:  # 3
        if plan.precision == Precision.FP8:  # validation refused it unless torchao runs it
            float8.apply_float8(part)
        if dims.tp > 1:
            tensor_parallel.apply_tp(part, mesh["tp"], plan.sequence_parallel, loss_parallel)
            if spec.tie_embeddings:
                retie(part)  # one DTensor for the embedding and the head (both Shard(0))
        if dims.cp > 1:
            context_parallel.apply_cp(part, mesh["cp"])
        if expert_mesh is not None:
            expert_parallel.apply_ep(part, expert_mesh, mesh["tp"] if dims.tp > 1 else None)
        rc = plan.recompute
        recompute.apply_recompute(part, rc.policy, rc.num_layers, rc.method, rc.modules)
        if expert_mesh is not None:
            expert_parallel.apply_expert_fsdp(part, expert_mesh, dims, plan.precision,
                                              plan.offload, plan.grad_reduce_dtype)
        if fsdp:
            data_parallel.apply_fsdp(part, mesh, dims, plan.precision, plan.offload,
                                     plan.grad_reduce_dtype)
    for part in parts:  # 4
        materialize_and_init(part, device, spec.num_layers, options.seed, spec.tie_embeddings)
        part.train()
    if ddp:  # 5
        parts = [data_parallel.apply_ddp(parts[0], mesh)]

    pm = ParallelModel(
        dims=dims, mesh=mesh, parts=parts, stage_indices=indices, num_stages=num_stages,
        n_microbatches=n_micro, local_batch_size=local_batch, loss_parallel=loss_parallel,
        ddp=ddp, fsdp=fsdp, tie_embeddings=spec.tie_embeddings,
        host_optimizer=host_optimizer(plan.offload),
    )
    if spec.tie_embeddings and dims.pp > 1:
        last = pipeline_parallel.stage_owner(num_stages - 1, dims.pp, plan.pipeline)
        pm.tied = TiedEmbeddings.build(parts, mesh, dims.pp, 0, last,
                                       pg_timeout(options.pg_timeout_s))
    pm.loss_fn = loss_fn = loss_function(spec.vocab_size, vocab_rows(spec, dims.tp))
    if plan.precision == Precision.FP16:
        pm.loss_scaler = LossScaler(device.type)
        loss_fn = pm.loss_scaler.loss_fn(pm.loss_fn)
    if dims.cp > 1:
        pm.cp_layout = context_parallel.LoadBalancedLayout(dims.cp, coordinate(mesh, "cp"))
    if dims.pp > 1:  # 6
        pm.schedule = pipeline_parallel.build_schedule(
            parts, indices, num_stages, mesh["pp"].get_group(), device, plan.pipeline,
            n_micro, loss_fn,
        )
    if expert_mesh is not None:
        pm.extras["expert_mesh"] = expert_mesh
    log.debug("rank layout: stages %s of %d, ddp=%s fsdp=%s", indices, num_stages, ddp, fsdp)
    return pm
