"""DeepSpeed's 3D parallelism for `--to deepspeed`: a Megatron-DeepSpeed `pretrain_gpt.py` launch.

Megatron tensor (and sequence) parallelism, DeepSpeed's pipeline engine and ZeRO, as one
`deepspeed pretrain_gpt.py ... --deepspeed --deepspeed_config ds.json` command. Flag spellings
and behaviour are those of deepspeedai/Megatron-DeepSpeed megatron/arguments.py at commit
f1feb8877d760b4ceaa0551debbf1cb4026fc9be (its `validate_args` and GPTModelPipe are cited where a
rule comes from them); the flags used are listed in tests/data/export/megatron_deepspeed_flags.yaml.
Data, tokenizer files and optimizer hyper-parameters are the user's, appended to the command.
"""

from __future__ import annotations

from autoplan.export.base import stage_layers
from autoplan.export.megatron_moe import megatron_hint
from autoplan.export.megatron_norms import MDS_EPS_FLAG
from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind
from autoplan.plan import (
    Attention,
    Plan,
    Precision,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    Schedule,
)
from autoplan.search.partition import deepspeed_layers

SCRIPT = "pretrain_gpt.py"
NULL_TOKENIZER_EXTRA = 1
"""--vocab-size is the "size of vocab before EOD or padding": NullTokenizer adds one EOD token."""


def runs_3d(plan: Plan) -> bool:
    """Plans that need Megatron's model code: tensor or pipeline parallelism."""
    return plan.parallel.tp > 1 or plan.parallel.pp > 1


def reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What Megatron-DeepSpeed cannot run of a plan with tp > 1 or pp > 1 that the plan rules
    accept (empty: it can)."""
    p, rc, why = plan.parallel, plan.recompute, []
    if model.moe is not None or model.mla is not None:
        why.append(f"model {model.name} has experts or latent attention: Megatron-DeepSpeed's "
                   "MoE is DeepSpeed-MoE (--num-experts), not the layers the plan was costed "
                   "for; " + megatron_hint(model))
    if model.mtp_layers:
        why.append(f"model.mtp_layers={model.mtp_layers}: Megatron-DeepSpeed has no "
                   "multi-token-prediction module; " + megatron_hint(model, "--mtp-num-layers"))
    if p.cp > 1:
        why.append(f"cp={p.cp}: Megatron-DeepSpeed has no ring context parallelism; its "
                   "--ds-sequence-parallel-size is DeepSpeed-Ulysses, an all-to-all head split")
    if model.mlp == MlpKind.GEGLU:
        why.append("mlp geglu: Megatron-DeepSpeed gates the MLP with SiLU only (--swiglu)")
    if model.qkv_bias:
        why.append("model.qkv_bias: Megatron-DeepSpeed biases every Linear or none "
                   "(--disable-bias-linear), it has no --add-qkv-bias for q, k and v alone; "
                   + megatron_hint(model, "--add-qkv-bias"))
    if model.qk_norm:
        why.append("model.qk_norm: Megatron-DeepSpeed has no per-head q and k norms (no "
                   "--qk-layernorm); " + megatron_hint(model, "--qk-layernorm"))
    if p.pp > 1:
        why += _pipeline_reasons(plan, model)
    if rc.policy != RecomputePolicy.NONE and rc.num_layers is not None \
            and rc.method != RecomputeMethod.UNIFORM:
        why.append(f"recompute.num_layers={rc.num_layers}: Megatron-DeepSpeed's DeepSpeed path "
                   "checkpoints every layer (--checkpoint-activations); it cannot limit "
                   "recompute to some layers per stage")
    if rc.modules is not None and rc.modules != (RecomputeModule.CORE_ATTN,):
        why.append(f"recompute.modules={[m.value for m in rc.modules]}: Megatron-DeepSpeed's "
                   "selective recompute is the attention core only (no --recompute-modules); "
                   "use modules [core_attn] or " + megatron_hint(model))
    return why


def _pipeline_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    p, pipe, why = plan.parallel, plan.pipeline, []
    if plan.zero_stage >= 2:
        why.append(f"zero_stage={plan.zero_stage} with pp={p.pp}: DeepSpeed's pipeline engine "
                   "supports ZeRO stage 0 or 1 only")
    if pipe.schedule != Schedule.ONE_F_ONE_B or pipe.vpp > 1:
        why.append(f"schedule {pipe.schedule.value} vpp={pipe.vpp}: DeepSpeed's pipeline engine "
                   "runs only its own non-interleaved 1F1B schedule")
    split = stage_layers(plan, model)
    if split is not None and len(set(split)) > 1 and pipe.vpp == 1:
        theirs = deepspeed_layers(model.num_layers, p.pp)
        if split != theirs:
            why.append(f"layers_per_stage {list(split)}: Megatron-DeepSpeed's GPTModelPipe "
                       "lets DeepSpeed partition the layers (partition_method type:transformer, "
                       f"evenly where pp divides them), which gives {list(theirs)}; set that "
                       "split")
    return why


def launch_args(plan: Plan, model: ModelSpec) -> list[str]:
    """pretrain_gpt.py flags for a plan `reasons` accepted, one flag (and value) per item;
    the caller adds `--deepspeed_config PATH`."""
    p, rc = plan.parallel, plan.recompute
    a = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}"]
    if p.pp == 1:  # GPTModel instead of GPTModelPipe: no pipeline engine (any ZeRO stage)
        a.append("--no-pipeline-parallel")
    if plan.sequence_parallel:
        a.append("--sequence-parallel")
    a += [f"--micro-batch-size {plan.batch.micro_batch_size}",
          f"--global-batch-size {plan.batch.global_batch_size}"]
    if rc.policy == RecomputePolicy.FULL:
        # GPTModelPipe checkpoints every checkpoint_num_layers blocks when this is set; the
        # flag is kept "because DeepSpeed still relies on the old activation checkpointing"
        # uniform: checkpointed groups of num_layers blocks (GPTModelPipe's
        # activation_checkpoint_interval; ParallelTransformer's chunks without a pipeline)
        group = rc.num_layers if rc.method == RecomputeMethod.UNIFORM else 1
        a += ["--checkpoint-activations", f"--checkpoint-num-layers {group}",
              "--deepspeed-activation-checkpointing"]
    elif rc.policy == RecomputePolicy.SELECTIVE:
        a.append("--recompute-granularity selective")  # the core attention only
    if plan.precision == Precision.BF16:
        a.append("--bf16")
    elif plan.precision == Precision.FP16:
        a.append("--fp16")
    if plan.attention == Attention.FLASH:
        a.append("--use-flash-attn-v2")
    a += _model_args(model)
    return a + ["--deepspeed", f"--zero-stage {plan.zero_stage}"]


def rope_note(m: ModelSpec) -> list[str]:
    """The RoPE base and its scaling (model.rope_scaling: Llama 3.1's or YaRN), as a comment:
    no flag for either is among the pinned ones this export checks (tests/data/export/
    megatron_deepspeed_flags.yaml), so none is written."""
    if m.position != PositionKind.ROPE:
        return []
    if m.rope_scaling is None:
        return [f"# RoPE base: model {m.name} rotates by theta {m.rope_theta:g}; no flag for it "
                "is written (this fork's is not checked):",
                "# make sure Megatron-DeepSpeed's rotary embedding uses that base."]
    return [f"# RoPE base and scaling: model {m.name} rotates by theta {m.rope_theta:g}"
            f"{rope_scaling_words(m)}; no flag for either is written (this fork's are not "
            "checked):",
            "# make sure Megatron-DeepSpeed's rotary embedding uses that base and applies that "
            "scaling."]


def rope_scaling_words(m: ModelSpec) -> str:
    """" with Llama 3.1's scaling (factor ..., ...)" or " with YaRN scaling (...)"
    (RopeScaling.describe) for a model with rope_scaling, else ""."""
    return "" if m.rope_scaling is None else f" with {m.rope_scaling.describe()}"


def _model_args(m: ModelSpec) -> list[str]:
    a = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
         f"--ffn-hidden-size {m.ffn}", f"--num-attention-heads {m.num_heads}"]
    if m.kv_heads != m.num_heads:
        a.append(f"--num-key-value-heads {m.kv_heads}")
    if m.q_width != m.hidden_size:  # Megatron's default head width is hidden / heads
        a.append(f"--kv-channels {m.head_dim}")
    a += [f"--seq-length {m.seq_len}", f"--max-position-embeddings {m.seq_len}",
          f"--attention-dropout {m.dropout}", f"--hidden-dropout {m.dropout}"]
    if m.mlp == MlpKind.SWIGLU:
        a.append("--swiglu")
    a.append("--normalization " + ("rmsnorm" if m.norm == NormKind.RMSNORM else "layernorm"))
    a.append(f"{MDS_EPS_FLAG} {m.norm_eps!r}")  # whatever its default (1e-5)
    if m.position == PositionKind.ROPE:  # validate_args then drops the learned table
        a.append("--use-rotary-position-embeddings")
    if not m.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        a.append("--disable-bias-linear")
    return a + ["--tokenizer-type NullTokenizer",
                f"--vocab-size {m.vocab_size - NULL_TOKENIZER_EXTRA}"]
