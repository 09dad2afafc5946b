"""`--to torchtitan`: a torchtitan job for a plan, as a Python config_registry module (torchtitan
>= 0.3, `--torchtitan-format python`) or as the TOML job file of releases up to 0.2.2 (`toml`).

torchtitan builds its dense models with its Llama 3 architecture (SwiGLU, RMSNorm, RoPE, no
biases): a model of that architecture uses the registered flavor of its shape, or, in the Python
form, a flavor the config defines at the model's own shape (Llama 2, say); the TOML form knows only
the registered flavors. Mixture-of-experts models match torchtitan's own Qwen3-MoE and DeepSeek-V3
flavors (torchtitan_moe.py). ZeRO maps to FSDP2 (2: keep parameters gathered after forward, 3:
reshard), ZeRO-0 to replication, which torchtitan runs only as the sole parallelism (the release's
runtime rules, runtime_reasons, refuse the rest); the pipeline split is written out as module
names per stage, so nothing depends on its defaults.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export import torchtitan_moe
from autoplan.export.base import ExportOptions, ExportTarget, layout, layout_reasons, stage_layers
from autoplan.export.launch import check_path_word, cuda_only_reasons
from autoplan.export.megatron_moe import megatron_hint
from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind
from autoplan.plan import Attention, Plan, Precision, RecomputeMethod, RecomputePolicy, Schedule
from autoplan.rope_scaling import LLAMA31_ROPE_SCALING, YARN_ROPE_TYPE, same_rotation

FLAVORS = {
    # (layers, hidden, heads, kv_heads, ffn, vocab, tied) -> (flavor, config_registry function)
    (16, 2048, 32, 8, 8192, 128256, True): ("1B", "llama3_1b"),
    (28, 3072, 24, 8, 8192, 128256, True): ("3B", "llama3_3b"),
    (32, 4096, 32, 8, 14336, 128256, False): ("8B", "llama3_8b"),
    (80, 8192, 64, 8, 28672, 128256, False): ("70B", "llama3_70b"),
    (126, 16384, 128, 8, 53248, 128256, False): ("405B", "llama3_405b"),
}
"""torchtitan's Llama 3 flavors (torchtitan/models/llama3/__init__.py); 1B/3B exist from 0.3 and
tie the output head to the embedding (enable_weight_tying=True), as Llama 3.2 does."""
FLAVOR_ROPE_THETA = 500000.0
"""The RoPE base of every Llama 3 flavor (torchtitan's rope theta 500000, Llama 3's): a model of
a flavor's shape at another base is defined at its own shape (Python) or refused (TOML)."""
FLAVOR_ROPE_SCALING = LLAMA31_ROPE_SCALING
"""Every Llama 3 flavor (1B to 405B) rotates with Llama 3.1's RoPE scaling at factor 8, low 1,
high 4, original 8192: torchtitan 0.2.2's TransformerModelArgs.rope_scaling_args defaults to
RoPEScalingArgs() (models/llama3/model/args.py), which precompute_freqs_cis always applies;
0.3.0's flavors pass ComplexRoPE.Config(scaling="llama") at those defaults
(models/llama3/__init__.py), read from both wheels. A model without it (Llama 3, Llama 2) or
with another (Llama 3.2's factor 32) is defined at its own rotation (Python) or refused (TOML)."""
FLAVOR_NORM_EPS = 1e-5
"""The epsilon of every Llama 3 flavor's RMSNorms (0.2.2 TransformerModelArgs.norm_eps; 0.3.0
RMSNorm.Config's default, which _build_llama3_layers leaves): a model at another one is defined
at its own (Python) or trained at this one, which the TOML's header says (norm_notes)."""
TOML_FLAVORS = ("8B", "70B", "405B")
PYTHON_REGISTRY = ("llama3_8b", "llama3_70b", "llama3_405b")
"""config_registry functions torchtitan 0.3 ships for Llama 3 (the others start from 8B's)."""
REGISTRY_PARAMS = {"llama3_8b": 8.03e9, "llama3_70b": 70.6e9, "llama3_405b": 405.9e9}
"""Parameters of the model each PYTHON_REGISTRY base is tuned for (learning rate and the
rest): a model defined at its own shape starts from the nearest."""


def nearest_base(model: ModelSpec) -> str:
    """The config_registry function closest in size (log of parameters) to `model`."""
    from autoplan.cost.params import total_params

    n = total_params(model)
    return min(REGISTRY_PARAMS, key=lambda base: abs(math.log(n / REGISTRY_PARAMS[base])))
SCHEDULES = {
    (Schedule.GPIPE, False): "GPipe",
    (Schedule.ONE_F_ONE_B, False): "1F1B",
    (Schedule.INTERLEAVED_1F1B, True): "Interleaved1F1B",
    (Schedule.ZERO_BUBBLE, True): "InterleavedZeroBubble",
}
"""(plan schedule, several stages per rank) -> torch.distributed.pipelining schedule name."""
ZERO_BUBBLE_V = "ZBVZeroBubble"
"""Zero-bubble with vpp == 2: autoplan places stages r and 2pp-1-r on rank r (the V shape its
cost model prices: cost/rows.py v_shape); torchtitan places stages that way only for this
schedule class (distributed/pipeline_parallel.py stage_ids_this_rank, style "v"; 0.2.2 and
0.3.0), every other one in a loop (r, r+pp, ...)."""
FLOAT8_CONVERTER = "quantize.linear.float8"
"""torchtitan 0.2.2's [model] converters name of its float8 Linear swap: the registry key
(components/quantization/float8.py register_model_converter(Float8LinearConverter,
"quantize.linear.float8")), which ModelConvertersContainer looks each name up by."""
FLOAT8_SKIPPED = ["output"]
"""Linears 0.2.2's float8 swap leaves 16-bit ([quantize.linear.float8] filter_fqns): the output
head, as autoplan prices an fp8 run (cost/stage_time.py: the output layer stays 16-bit) and
torchtitan's own 405B recipe filters it (0.3.0's `lm_head`: torchtitan_text.float8_converters)."""


def schedule_name(plan: Plan) -> str | None:
    """torch.distributed.pipelining's name for the plan's schedule in torchtitan (None: none)."""
    pipe = plan.pipeline
    if pipe.schedule == Schedule.ZERO_BUBBLE and pipe.vpp == 2:
        return ZERO_BUBBLE_V
    return SCHEDULES.get((pipe.schedule, pipe.vpp > 1))


def architecture_reasons(model: ModelSpec) -> list[str]:
    """How the model departs from torchtitan's Llama 3 architecture, the one dense model it
    builds (torchtitan/models/llama3/model.py; head_dim = dim / n_heads there)."""
    m, why = model, []
    if m.mlp != MlpKind.SWIGLU:
        why.append(f"mlp {m.mlp.value} (torchtitan: swiglu)")
    if m.norm != NormKind.RMSNORM:
        why.append(f"norm {m.norm.value} (rmsnorm)")
    if m.position != PositionKind.ROPE:
        why.append(f"position {m.position.value} (rope)")
    if m.bias:
        why.append("linear biases (none)")
    if m.qkv_bias:
        why.append("model.qkv_bias: q, k and v biases (none)")
    if m.qk_norm:
        why.append("model.qk_norm: q and k normalised per head (none)")
    if m.q_width != m.hidden_size:
        why.append(f"head_dim {m.head_dim} (hidden_size / num_heads = "
                   f"{m.hidden_size // m.num_heads})")
    return why


def yarn_reasons(model: ModelSpec) -> list[str]:
    """YaRN a dense torchtitan model cannot run: its ComplexRoPE applies YaRN's frequencies
    only (a pure rotation, 0.3.0 models/common/rope.py) and its Llama 3 attention keeps
    1/sqrt(d), so a YaRN that scales cos/sin (HF's attention_factor: gpt-oss's 1.347) or the
    softmax (mscale_all_dim) would train another model."""
    s = model.rope_scaling
    if s is None or s.rope_type != YARN_ROPE_TYPE or (
            s.attention_scaling == 1.0 and s.softmax_gain == 1.0):
        return []
    return [f"model.rope_scaling: the model rotates with {s.describe()}, torchtitan's Llama 3 "
            f"by YaRN's frequencies alone (ComplexRoPE: cos/sin x1, softmax x1); set "
            "attention_factor: 1.0 and drop mscale_all_dim to train it so, or export to "
            "another target"]


def flavor(model: ModelSpec) -> tuple[str, str] | None:
    """torchtitan's registered Llama 3 flavor of the model's shape, if there is one."""
    m = model
    if architecture_reasons(m):
        return None
    if m.rope_theta != FLAVOR_ROPE_THETA or not same_rotation(m.rope_scaling,
                                                               FLAVOR_ROPE_SCALING):
        return None
    return FLAVORS.get((m.num_layers, m.hidden_size, m.num_heads, m.kv_heads, m.ffn, m.vocab_size,
                        m.tie_embeddings))


def norm_notes(model: ModelSpec, fmt: str) -> list[str]:
    """What the header says of the norms' epsilon where the export cannot set it: torchtitan's
    own flavors (Llama 3 in the TOML, and the MoE flavors) build theirs at a fixed one
    (FLAVOR_NORM_EPS, MoeFlavor.norm_eps); a Python config defining the model sets it."""
    moe = torchtitan_moe.moe_flavor(model)
    if moe is None and fmt == "python":
        return []
    name, eps = (("llama3", FLAVOR_NORM_EPS) if moe is None
                 else (f"{moe.family} {moe.flavor}", moe.norm_eps))
    if model.norm_eps == eps:
        return []
    return [f"The model's norms normalise at eps {model.norm_eps:g} (norm_eps); torchtitan's "
            f"{name} builds them at {eps:g},", "which no setting of this file changes: it trains "
            f"at {eps:g} (export to megatron for --norm-epsilon {model.norm_eps!r})."]


def _reasons(plan: Plan, model: ModelSpec, fmt: str) -> list[str]:
    p, pipe, why = plan.parallel, plan.pipeline, []
    if model.moe is not None or model.mla is not None:
        why += torchtitan_moe.moe_reasons(plan, model, fmt)
    else:
        if model.mtp_layers:
            why.append(f"model.mtp_layers={model.mtp_layers}: the Llama 3 model this export "
                       "writes has no multi-token-prediction module; "
                       + megatron_hint(model, "--mtp-num-layers"))
        found, unlike, yarn = flavor(model), architecture_reasons(model), yarn_reasons(model)
        if unlike:
            why.append(f"model {model.name}: torchtitan builds dense models with its Llama 3 "
                       f"architecture, which this model departs from: {'; '.join(unlike)}")
        elif yarn:
            why += yarn
        elif fmt == "toml" and (found is None or found[0] not in TOML_FLAVORS):
            why.append(f"model {model.name} matches no torchtitan 0.2.2 Llama 3 flavor (8B, 70B, "
                       "405B, all at rope_theta 500000 with Llama 3.1's RoPE scaling, factor "
                       "8), and its TOML cannot define one: use --torchtitan-format python, "
                       "whose config defines a flavor of the model's shape, base and scaling")
        if model.tie_embeddings and p.pp > 1:
            why.append("tie_embeddings with pp > 1: torchtitan 0.3 has no weight tying under "
                       "a pipeline (Decoder.Config.update_from_config); use pp 1")
    if plan.attention == Attention.EAGER:
        why.append("attention eager: torchtitan always runs fused SDPA attention")
    if model.dropout > 0:
        why.append(f"model dropout {model.dropout}: torchtitan's Llama 3 has no dropout")
    if plan.precision == Precision.FP16:
        why.append("precision fp16: torchtitan trains in bf16 or fp32")
    if p.pp > 1:
        if schedule_name(plan) is None:
            why.append(
                f"schedule {pipe.schedule.value} with vpp={pipe.vpp}: torchtitan runs "
                "GPipe/1F1B with one stage per rank, Interleaved1F1B/"
                "InterleavedZeroBubble/ZBVZeroBubble with several"
            )
    return why


def settings(plan: Plan, model: ModelSpec, fmt: str) -> dict[str, dict[str, Any]]:
    """Section -> field -> value, in torchtitan's own names (TOML sections / config fields)."""
    p, b = plan.parallel, plan.batch
    training: dict[str, Any] = {"seq_len": model.seq_len, "global_batch_size": b.global_batch_size}
    # With a pipeline the local batch is split into micro-batches; without one, torchtitan
    # accumulates gradients over global / (local * dp) forward passes of local_batch_size.
    training["local_batch_size"] = b.global_batch_size // p.dp if p.pp > 1 else b.micro_batch_size
    training["mixed_precision_param"] = (
        "float32" if plan.precision == Precision.FP32 else "bfloat16"
    )
    training["enable_cpu_offload"] = plan.offload.params
    if plan.grad_reduce_dtype is not None:  # only float32 passes _reasons
        training["mixed_precision_reduce"] = "float32"
    par: dict[str, Any] = {  # HSDP: dp / dp_shard replicas of dp_shard-way FSDP
        "data_parallel_replicate_degree": p.dp if plan.zero_stage == 0 else p.replicate_degree,
        "data_parallel_shard_degree": 1 if plan.zero_stage == 0 else p.shard_degree,
        "fsdp_reshard_after_forward": "always" if plan.zero_stage == 3 else "never",
        "tensor_parallel_degree": p.tp,
        "context_parallel_degree": p.cp,
        "pipeline_parallel_degree": p.pp,
    }
    if model.moe is not None:
        par.update(torchtitan_moe.moe_parallelism(plan, fmt))
    if fmt == "python":
        par["enable_sequence_parallel"] = plan.sequence_parallel
        # torchtitan 0.3 captures the step in a CUDA graph unless told not to, and refuses that
        # with a pipeline or with its all-to-all expert dispatch, which syncs with the host
        # (Trainer.Config._validate_cuda_graphs)
        if p.pp > 1 or (model.moe is not None and p.ep > 1):
            training["disable_cuda_graphs"] = True
    if p.pp > 1:
        split = stage_layers(plan, model)
        assert split is not None
        par["pipeline_parallel_schedule"] = schedule_name(plan)
        par["pipeline_parallel_microbatch_size"] = b.micro_batch_size
        par["module_fqns_per_model_part"] = module_parts(split, fmt)
    out = {"training": training, "parallelism": par,
           "activation_checkpoint": activation_checkpoint(plan, model, fmt)}
    if fmt == "toml":
        moe = torchtitan_moe.moe_flavor(model)
        out["model"] = ({"name": "llama3", "flavor": (flavor(model) or ("?",))[0]} if moe is None
                        else {"name": moe.family, "flavor": moe.flavor})
        if plan.precision == Precision.FP8:  # torchao's Float8Linear (tensorwise scaling)
            out["model"]["converters"] = [FLOAT8_CONVERTER]
            out[FLOAT8_CONVERTER] = {"filter_fqns": FLOAT8_SKIPPED}
    return out


def _every_nth(plan: Plan, model: ModelSpec, fmt: str) -> int | None:
    """TOML only (torchtitan <= 0.2.2's job config): selective_ac_option = n checkpoints
    every n-th block (a counter over the
    blocks it wraps, torchtitan/distributed/activation_checkpoint.py _apply_layer_sac): the
    block method's first k of L layers costs the same when pp = 1 and k divides L (n = L/k)."""
    rc = plan.recompute
    k = rc.num_layers
    if (fmt != "toml" or rc.policy != RecomputePolicy.FULL or rc.method != RecomputeMethod.BLOCK
            or k is None or k == 0 or plan.parallel.pp > 1 or model.num_layers % k):
        return None
    return model.num_layers // k


def activation_checkpoint(plan: Plan, model: ModelSpec, fmt: str) -> dict[str, Any]:
    """[activation_checkpoint]: full; selective with selective_ac_option "op" (op-level SAC:
    saves matmul and SDPA outputs, priced by the torchtitan runtime traits as op-sac) or "n"
    (full checkpointing of every n-th block); none."""
    rc = plan.recompute
    # full checkpointing stops recomputing once the last saved tensor is back, as the torchtitan
    # runtime prices it (recompute_early_stop); 0.2.2 passes ActivationCheckpoint.early_stop
    # (default false) to every checkpoint_wrapper; 0.3.0's FullAC has no such field
    early_stop = {"early_stop": True} if fmt == "toml" else {}
    nth = _every_nth(plan, model, fmt)
    if nth is not None:
        return {"mode": "selective", "selective_ac_option": str(nth), **early_stop}
    if rc.policy == RecomputePolicy.FULL:
        return {"mode": "full", **early_stop}
    if rc.policy == RecomputePolicy.SELECTIVE:
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": "none"}


def module_parts(split: tuple[int, ...], fmt: str) -> list[list[str]]:
    """Module names of each pipeline stage: embeddings first, norm and output head last."""
    parts, first = [], 0
    for n in split:
        parts.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output" if fmt == "toml" else "lm_head"]
    return parts


CUDA_ONLY = ("torchtitan trains on an accelerator (with none it takes device type cuda: "
             "torchtitan/tools/utils.py get_device_info)")
RUNTIMES = {"python": "torchtitan-0.3", "toml": "torchtitan"}
"""Each format's release as a runtime-traits preset (cost/runtime_presets.py): the Python config is
torchtitan 0.3.0's, the TOML 0.2.2's. `export` prices the plan with the same preset."""


def runtime_reasons(plan: Plan, model: ModelSpec, fmt: str) -> list[str]:
    """What the release `fmt` targets cannot run by its runtime traits: the rules `search
    --runtime` keeps to and `estimate` names (cost/runtime_rules.py), so the planner and this
    export refuse the same plans (ZeRO-0 beside tp, pp or cp, say, which torchtitan refuses
    as "DDP has not supported > 1D parallelism" or shards over cp; bf16 without FSDP or tp
    without sequence parallelism, which 0.2.2 runs otherwise than planned). Where only the
    TOML release refuses, the reasons say that the Python config (0.3) runs the plan."""
    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import load_runtime

    why = refusals(plan, load_runtime(RUNTIMES[fmt]), model)
    if why and fmt == "toml" and not refusals(plan, load_runtime(RUNTIMES["python"]), model):
        why.append("torchtitan 0.3 runs this plan as it is: use --torchtitan-format python")
    return why


TORCHTITAN_MODULES = frozenset({
    "deepseek_v3", "flux", "gpt_oss", "kimi_k2_7", "llama3", "muse_glimmer", "qwen3", "qwen3_5",
    "transformers_modeling_backend", "rl", "alphabet_sort", "dapo_math", "search_r1"})
"""--module short names torchtitan 0.3.0 resolves to its own config_registry, never to a file
on PYTHONPATH (config/manager.py: a name in models._supported_models | experiments.
_supported_experiments imports torchtitan.models.NAME.config_registry, or experiments.NAME's)."""
IMPORTED_PACKAGES = frozenset({
    "torch", "torchtitan", "numpy", "torchdata", "torch_checkpointing", "datasets", "tokenizers",
    "safetensors", "tyro", "tensorboard", "wandb", "einops", "PIL", "spmd_types"})
"""Packages torchtitan 0.3.0 runs on (torch and its Requires-Dist): a NAME.py first on
PYTHONPATH would be imported in their place."""


def _module_clash(name: str) -> str | None:
    """The module `--module name` clashes with (resolved first, or shadowed on PYTHONPATH in
    place of one torchtitan imports); None where the name is the exported file's alone."""
    if name in TORCHTITAN_MODULES:
        return f"torchtitan's own {name} config_registry"
    if name in sys.stdlib_module_names:
        return f"Python's standard-library module {name}"
    if name in IMPORTED_PACKAGES:
        return f"the {name} package torchtitan runs on"
    return None


def check_out_name(opts: ExportOptions) -> None:
    """torchtitan imports the Python config as a module: its --out must be NAME.py, NAME an
    identifier (`--module NAME`) that names no module torchtitan finds first. A file name,
    not the plan, is wrong: refused as --out (exit 2) before the plan is judged."""
    if opts.out is None or opts.torchtitan_format != "python":
        return
    path = Path(opts.out)
    if path.suffix != ".py" or not path.stem.isidentifier():
        fixed = "".join(ch if ch.isalnum() else "_" for ch in path.stem) or "job"
        toml = ("leave --torchtitan-format python out (a .toml --out writes the TOML job)"
                if path.suffix == ".toml" else "export --torchtitan-format toml")
        raise ConfigError("--out", f"got {opts.out!r}: torchtitan imports the config as a "
                          "module, so it must be NAME.py with NAME a Python identifier",
                          f"name it e.g. {path.with_name(fixed + '.py')}, or {toml}")
    clash = _module_clash(path.stem)
    if clash is not None:
        raise ConfigError("--out", f"got {opts.out!r}: torchtitan imports the config as "
                          f"--module {path.stem}, which clashes with {clash}",
                          f"name it otherwise, e.g. {path.with_name(path.stem + '_job.py')}")


class TorchtitanTarget(ExportTarget):
    name = "torchtitan"
    summary = "torchtitan job: Python config_registry (>= 0.3) or TOML (<= 0.2.2)"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        if opts.out is not None:  # named in the file's run instructions, a comment line
            check_path_word("--out", opts.out)
            check_out_name(opts)
        why = layout_reasons(plan, opts.gpus_per_node) + cuda_only_reasons(plan, CUDA_ONLY)
        if opts.torchtitan_format not in ("python", "toml"):
            why.append(f"--torchtitan-format {opts.torchtitan_format!r}: choose python or toml")
            return why
        fmt = opts.torchtitan_format
        return why + _reasons(plan, model, fmt) + runtime_reasons(plan, model, fmt)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        from autoplan.export import torchtitan_text

        lay = layout(plan, opts.gpus_per_node)
        values = settings(plan, model, opts.torchtitan_format)
        if opts.torchtitan_format == "toml":
            return {"torchtitan.toml": torchtitan_text.toml_text(
                plan, model, values, lay, opts.out, norm_notes(model, "toml"))}
        moe, found = torchtitan_moe.moe_flavor(model), flavor(model)
        fp8 = (torchtitan_text.float8_converters(experts=moe is not None)
               if plan.precision == Precision.FP8 else None)
        if moe is not None:
            base, lines = moe.base, torchtitan_moe.python_model_lines(model, moe, fp8)
        elif found is not None and model.norm_eps == FLAVOR_NORM_EPS:
            base = found[1] if found[1] in PYTHON_REGISTRY else "llama3_8b"
            lines = torchtitan_text.flavor_lines(found[0], fp8)
        else:  # a Llama 3 architecture at a shape (or epsilon) torchtitan does not register
            base, lines = nearest_base(model), torchtitan_text.custom_model_lines(model, fp8)
        notes = norm_notes(model, "python")
        if notes:
            lines = lines._replace(note="\n".join(filter(None, [lines.note, *notes])))
        return {"autoplan_torchtitan.py": torchtitan_text.python_text(model, values, base, lay,
                                                                      opts.out, lines)}
