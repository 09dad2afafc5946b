"""Read a run in the published-runs schema as its software ran it.

The schema is tests/data/published/published-open.yaml's (its `units` block says what each field
holds): a model's shape (layers, hidden, heads, kv_heads, ffn_hidden, seq_len, vocab, params in
billions), the cluster (a GPU name and count), the plan (tp, pp, dp, cp, vpp, sp, zero_stage,
offload, recompute, micro_batch, global_batch), the measured figures (iteration time, tokens/s,
TFLOP/s with the paper's FLOP convention, MFU, peak memory) and the paper's `framework`. It
says nothing of the architecture's details or of the software's traits, so this module reads
them off what the run does say, each rule stated where it is made:

- runtime_of: the framework's name (and the run's year) -> one of autoplan's runtime presets;
- profile_of: the GPU's name -> a profile shipped in profiles/ (None where none matches: such a
  run is listed, not priced on another GPU's figures);
- architecture: GPT-style (GELU, LayerNorm, learned positions, biases, dropout 0.1: Megatron-LM's
  GPT) or Llama-style (SwiGLU, RMSNorm, RoPE, no biases, no dropout), tied or not, whichever
  parameter count lies nearest the published one; by the FFN width where no count is published;
- measured_step_s: the iteration time, else tokens/s, else TFLOP/s or MFU under the FLOP
  convention the paper states (flops_convention's text; a convention not recognised is not
  guessed at: the run is listed, not scored);
- to_entry: the run as a practitioner-schema entry (benchmarks/practitioner.py builds it).

A run with a field these rules cannot read is never priced on a guess: `why_not_priced` names the
field, and the caller lists the run with that reason.
"""

from __future__ import annotations

import re
from typing import Any

from autoplan.cost.params import total_params
from autoplan.model_spec import ModelSpec, load_model

GPU_GIB = 2**30

PLAN_FIELDS = ("tp", "pp", "micro_batch", "global_batch", "recompute")
"""Plan fields a run must publish to be priced as it ran (dp follows from the GPU count)."""


# --- the framework -> a runtime preset --------------------------------------------------------

def run_year(run: dict) -> int | None:
    """The year the run's software is from: the first year in its `framework` text (NGC/NeMo
    releases name theirs YY.MM: "NeMo 24.07" is 2024), else in its `source` (an arXiv id's
    YYMM counts), else None."""
    framework, source = str(run.get("framework") or ""), str(run.get("source") or "")
    for text in (framework, source):
        year = re.search(r"\b(20[12]\d)\b", text)
        if year:
            return int(year.group(1))
        release = re.search(r"\b(?:NeMo|NGC|nemo|ngc)[^0-9]{0,12}(\d\d)\.(\d\d)\b", text)
        if release:
            return 2000 + int(release.group(1))
    arxiv = re.search(r"arXiv[: ]*(\d\d)(\d\d)\.\d{4,5}", source)
    return 2000 + int(arxiv.group(1)) if arxiv else None


def runtime_of(run: dict) -> str:
    """The runtime preset that prices the run, from its framework's name:

    - nanotron, llm-foundry (MosaicML's Composer), torchtitan: their own presets; NeMo AutoModel
      and plain PyTorch FSDP take torchtitan's (FSDP2/FSDP with SDPA, the same PyTorch parts);
    - DeepSpeed and Megatron-DeepSpeed: deepspeed, but the SC21 table's Megatron-LM rows that
      only name DeepSpeed for their ZeRO-3 runs stay Megatron-LM's (only the ZeRO-3 rows ran it);
    - NeMo and Megatron-Bridge from 2023 on: nemo (Megatron-Core with Transformer Engine's
      tensor-parallel overlap, as their recipes turn on); NeMo Megatron of 2022 and earlier is
      the Megatron-LM code of its year;
    - Megatron-LM: the 2021 release (megatron-2021) up to 2021, the 2022 one (megatron-2022,
      selective recompute and sequence parallelism) in 2022, Megatron-Core (megatron) after;
      MegaScale (ByteDance's Megatron-LM-based system) and a run of unknown year take
      Megatron-Core's;
    - anything else: Megatron-Core's, the most common stack of published large runs (the row
      says the runtime was assumed: `assumptions`)."""
    framework = str(run.get("framework") or "").lower()
    year = run_year(run)
    if "nanotron" in framework:
        return "nanotron"
    if any(k in framework for k in ("llm-foundry", "llm foundry", "composer", "mosaic")):
        return "llm-foundry"
    if any(k in framework for k in ("torchtitan", "automodel", "fsdp")):
        return "torchtitan"
    if "deepspeed" in framework:
        sc21_megatron = "megatron-lm (" in framework and "zero-3" in framework
        if not sc21_megatron or run["plan"].get("zero_stage") == 3:
            return "deepspeed"
    if any(k in framework for k in ("nemo", "megatron-bridge", "megatron bridge")) and (
            year is None or year >= 2023):
        return "nemo"
    if "megascale" in framework or "core" in framework or "mcore" in framework:
        return "megatron"
    if year is not None and year <= 2021:
        return "megatron-2021"
    if year == 2022:
        return "megatron-2022"
    return "megatron"


def _known_runtime(run: dict) -> bool:
    framework = str(run.get("framework") or "").lower()
    return any(k in framework for k in ("nanotron", "llm-foundry", "llm foundry", "composer",
                                        "mosaic", "torchtitan", "automodel", "fsdp", "deepspeed",
                                        "nemo", "megatron", "megascale"))


# --- the GPU's name -> a shipped profile ------------------------------------------------------

def profile_of(run: dict) -> str | None:
    """The profile in profiles/ for the run's GPU, or None where none is that GPU.

    The name is read for its family (V100, A100, H100, H200, H800), its memory ("80GB") and its
    form (SXM, or PCIe/NVL, which have other clocks, power and links: no profile). An A100 80GB
    cluster whose `interconnect` is Omni-Path (Jean Zay's, BLOOM's) takes a100-80gb-opa; an
    H100 with 94-96 GB is Meta's Grand Teton part at 500 W (h100-96gb-500w)."""
    cluster = run["cluster"]
    name = re.sub(r"[\s_]+", "", str(cluster.get("gpu") or "")).upper()
    link = str(cluster.get("interconnect") or "").lower()
    # the memory size is read past the family's own digits ("A10080GB": 80)
    memory = re.search(r"(\d+)GB", re.sub(r"^.*?[VAHB]\d00", "", name))
    gb = int(memory.group(1)) if memory else None
    if any(form in name for form in ("PCIE", "NVL")) or name.startswith("GH"):
        return None
    if "V100" in name:
        return "v100-sxm2-32gb" if gb in (None, 32) else None
    if "A100" in name:
        if gb == 40:
            return "a100-sxm4-40gb"
        if gb in (None, 80):
            opa = "omni-path" in link or "omnipath" in link or re.search(r"\bopa\b", link)
            return "a100-80gb-opa" if opa else "a100-sxm4-80gb"
        return None
    if "H100" in name:
        if gb in (94, 96):
            return "h100-96gb-500w"
        return "h100-sxm-80gb" if gb in (None, 80) else None
    if "H200" in name:
        return "h200-sxm-141gb" if gb in (None, 141) else None
    if "H800" in name:
        return "h800-sxm-80gb" if gb in (None, 80) else None
    return None


# --- the architecture the shape and parameter count imply -------------------------------------

GPT_STYLE = {"mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True,
             "dropout": 0.1, "tie_embeddings": True}
"""Megatron-LM's GPT as the SC21 and 2022 papers ran it: hidden and attention dropout 0.1, the
output layer sharing the input embedding's weights (its default until
--untie-embeddings-and-output-weights)."""
LLAMA_STYLE = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
               "dropout": 0.0, "tie_embeddings": False}
"""Llama's (Touvron et al. 2023; Dubey et al. 2024): SwiGLU, RMSNorm, rotary positions, no
biases, no dropout, an untied head."""


def _shape(run: dict) -> dict[str, Any]:
    m = run["model"]
    return {"name": str(run["id"]), "num_layers": m["layers"], "hidden_size": m["hidden"],
            "num_heads": m["heads"], "num_kv_heads": m.get("kv_heads"),
            "ffn_hidden_size": m.get("ffn_hidden"), "vocab_size": m["vocab"],
            "seq_len": m["seq_len"]}


def _half_unit(params: float) -> float:
    """Half the last published digit of a parameter count in billions (175 -> 0.5e9, 174.6 ->
    0.05e9): counts within it of the figure are the same count."""
    text = repr(params)
    decimals = len(text.split(".")[1]) if "." in text and not text.endswith(".0") else 0
    return 0.5 * 10.0 ** -decimals * 1e9


def architecture(run: dict) -> tuple[dict[str, Any], str]:
    """(the architecture's fields, how they were chosen): GPT_STYLE or LLAMA_STYLE. With a
    published parameter count, the style whose count (autoplan.cost.params.total_params, tied
    or not) comes nearest it, tied as the style comes unless only the other way matches the
    count to its last published digit; without one, GELU where the FFN is 4x the hidden size
    (or unstated) and SwiGLU otherwise (Llama's 8/3 h rounded up, 3.5 h in Llama 3)."""
    shape, params = _shape(run), run["model"].get("params")
    if not params:
        ffn, hidden = run["model"].get("ffn_hidden"), run["model"]["hidden"]
        if ffn is None or ffn == 4 * hidden:
            return GPT_STYLE, "gpt-style: FFN 4x hidden, no parameter count published"
        return LLAMA_STYLE, "llama-style: FFN not 4x hidden, no parameter count published"
    published, half = float(params) * 1e9, _half_unit(params)
    counts = {(style, tied): total_params(load_model({**shape, **arch, "tie_embeddings": tied}))
              for style, arch in (("gpt", GPT_STYLE), ("llama", LLAMA_STYLE))
              for tied in (True, False)}
    style = min(counts, key=lambda k: abs(counts[k] - published))[0]
    arch = GPT_STYLE if style == "gpt" else LLAMA_STYLE
    tied = arch["tie_embeddings"]
    if abs(counts[(style, tied)] - published) > half >= abs(counts[(style, not tied)] - published):
        tied = not tied
    how = (f"{style}-style, {'tied' if tied else 'untied'}: {counts[(style, tied)] / 1e9:.2f}B "
           f"parameters against the published {params}B")
    return {**arch, "tie_embeddings": tied}, how


def model_of(run: dict) -> ModelSpec:
    arch, _ = architecture(run)
    return load_model({**_shape(run), **arch})


# --- measured figures ---------------------------------------------------------------------------

def flops_per_token(convention: str, model: ModelSpec) -> tuple[float, str] | None:
    """(model FLOPs per trained token, the convention's name) under the paper's own FLOP count,
    recognised from its `flops_convention` text; None where the text names none of these:

    - Megatron SC21 eq. 3, 96*B*s*l*h^2*(1 + s/6h + V/16lh) per iteration (counts the
      recompute forward);
    - Korthikanti et al. 2022 eq. 7 (model FLOPs), 72*B*L*s*h^2*(1 + s/6h + V/12Lh);
    - PaLM's (Chowdhery et al. 2022, Appendix B), 6N + 12*L*h*s per token;
    - 6N (Kaplan et al. 2020; 6ND)."""
    L, h, s, V = model.num_layers, model.hidden_size, model.seq_len, model.vocab_size
    text = convention.replace(" ", "").lower()
    if "96*b*s*l*h^2" in text or "eq.(3)" in text:
        return 96 * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h)), "megatron-sc21"
    if "72*b*l*s*h^2" in text or "eq.(7)" in text:
        return 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)), "korthikanti-eq7"
    if "palm" in text or "12*l*h*s" in text or "12lhs" in text:
        return 6.0 * total_params(model) + 12.0 * L * h * s, "palm"
    if re.search(r"\b6\s*\*?\s*N(D)?\b", convention, re.I) or "6*params" in text:
        return 6.0 * total_params(model), "6n"
    return None


def _peak_tflops(run: dict) -> float | None:
    """The peak an MFU was stated against: "peak NNN TFLOP" in the convention text."""
    found = re.search(r"peak\s*(?:of\s*)?(\d+(?:\.\d+)?)\s*TFLOP", str(run.get("flops_convention")
                                                                       or ""), re.I)
    return float(found.group(1)) if found else None


def measured_step_s(run: dict, model: ModelSpec) -> tuple[float | None, str]:
    """(seconds per optimizer step, how it was read), or (None, why not)."""
    meas, plan, gpus = run["measured"], run["plan"], run["cluster"]["gpus"]
    if meas.get("iteration_time_s"):
        return float(meas["iteration_time_s"]), "iteration_time_s"
    if not plan.get("global_batch"):
        return None, "no global batch to turn a rate into a step"
    tokens = plan["global_batch"] * model.seq_len
    if meas.get("tokens_per_s_per_gpu"):
        return tokens / (meas["tokens_per_s_per_gpu"] * gpus), "tokens_per_s_per_gpu"
    if meas.get("tokens_per_s"):
        return tokens / meas["tokens_per_s"], "tokens_per_s"
    convention = str(run.get("flops_convention") or "")
    counted = flops_per_token(convention, model)
    if meas.get("tflops_per_gpu"):
        if counted is None:
            return None, "TFLOP/s under a FLOP convention not recognised (flops_convention)"
        return tokens * counted[0] / (meas["tflops_per_gpu"] * 1e12 * gpus), \
            f"tflops_per_gpu ({counted[1]})"
    if meas.get("mfu"):
        peak = _peak_tflops(run)
        if counted is None or peak is None:
            return None, "MFU without a recognised FLOP convention and its peak"
        return tokens * counted[0] / (meas["mfu"] * peak * 1e12 * gpus), f"mfu ({counted[1]})"
    return None, "no iteration time, tokens/s, TFLOP/s or MFU published"


def measured_memory_gib(run: dict) -> float | None:
    """The published peak memory in GiB: `memory_gb` in its `memory_unit` (GiB where the unit
    says so, else decimal GB)."""
    value = run["measured"].get("memory_gb")
    if not value:
        return None
    unit = str(run.get("memory_unit") or "").lower()
    return float(value) if "gib" in unit else float(value) * 1e9 / GPU_GIB


def memory_basis(run: dict) -> str | None:
    """The allocator counter the memory was read from, where the unit names one."""
    unit = str(run.get("memory_unit") or "").lower()
    return "max reserved" if "reserved" in unit else None


# --- the run as a practitioner-schema entry -----------------------------------------------------

DEFAULT_ZERO = {"torchtitan": 3, "llm-foundry": 3, "nemo": 1, "megatron": 1, "deepspeed": 1,
                "nanotron": 1, "megatron-2021": 0, "megatron-2022": 0}
"""ZeRO stage where a run leaves it null: FSDP's full shard for the FSDP stacks (torchtitan's and
llm-foundry's defaults), the distributed optimizer NeMo's and Megatron-Core's recipes turn on,
DeepSpeed's ZeRO-1 (its pipeline engine's), nanotron's configs' zero_stage 1, and none in
Megatron-LM's 2021-22 code (no distributed optimizer yet)."""


def why_not_priced(run: dict) -> str | None:
    """Why the run cannot be priced as it ran; None where it can."""
    if run.get("test_quality", "complete") != "complete":
        missing = ", ".join(f"plan.{k}" for k in PLAN_FIELDS if run["plan"].get(k) is None)
        return f"test_quality {run.get('test_quality')}" + (f": {missing} not published"
                                                            if missing else "")
    missing = [f"plan.{k}" for k in PLAN_FIELDS if run["plan"].get(k) is None]
    missing += [f"model.{k}" for k in ("layers", "hidden", "heads", "seq_len", "vocab")
                if run["model"].get(k) is None]
    if missing:
        return f"{', '.join(missing)} not published"
    if any(k in run["model"] for k in ("experts", "num_experts", "moe")):
        return "a mixture-of-experts model: the schema carries no expert fields"
    if profile_of(run) is None:
        return f"no profile for GPU {run['cluster'].get('gpu')}"
    return None


def _offload(offload: bool, modes: tuple[str, ...]) -> dict[str, bool]:
    """The schema's offload flag as the runtime offloads: the optimizer (ZeRO-Offload,
    Megatron's HybridDeviceOptimizer) where it can, else parameters and optimizer together
    (FSDP's CPUOffload, the only offload torchtitan and llm-foundry have)."""
    both = offload and "optimizer" not in modes and "both" in modes
    return {"optimizer": offload, "params": both}


def _parallel(run: dict) -> dict[str, int]:
    p, gpus = run["plan"], run["cluster"]["gpus"]
    tp, pp, cp = p["tp"], p["pp"], p.get("cp") or 1
    return {"dp": p.get("dp") or max(1, gpus // (tp * pp * cp)), "tp": tp, "pp": pp, "cp": cp}


def to_entry(run: dict) -> tuple[dict[str, Any], list[str]]:
    """(the run as a practitioner-schema entry, what was assumed rather than published)."""
    from autoplan.cost.runtimes import runtime_from_dict

    p = run["plan"]
    runtime = runtime_of(run)
    traits = runtime_from_dict({"schema_version": 1, "base": runtime}, "runtime")
    arch, how = architecture(run)
    assumed = [f"runtime {runtime}" + ("" if _known_runtime(run) else " (framework unknown)"),
               how]
    parallel = _parallel(run)
    if p.get("dp") is None:
        assumed.append("dp = GPUs / (tp * pp * cp)")
    zero = p.get("zero_stage")
    if zero is None:
        zero = DEFAULT_ZERO.get(runtime, 0)
        assumed.append(f"zero_stage {zero} ({runtime}'s default)")
    sp = p.get("sp")
    if sp is None:
        sp = bool(parallel["tp"] > 1 and traits.has_sequence_parallel
                  and runtime not in ("megatron-2021",))
        assumed.append(f"sequence_parallel {sp}")
    year = run_year(run)
    # Megatron-LM's 2021-22 code and the DeepSpeed runs of those years ran unfused softmax
    # attention; FlashAttention (2022) entered Megatron-Core, NeMo and the PyTorch stacks after
    eager = runtime in ("megatron-2021", "megatron-2022") or (
        runtime in ("deepspeed", "megatron") and year is not None and year <= 2022)
    precision = str(run.get("precision") or "").lower()
    dtype = ("fp8" if "fp8" in precision else "fp16" if "fp16" in precision
             else "fp32" if precision in ("fp32", "tf32") else "bf16")
    vpp = p.get("vpp") or 1
    entry = {
        "id": str(run["id"]), "runtime": runtime,
        "source": {"id": source_of(run), "title": str(run.get("source") or run["id"])},
        "model": {**_shape(run), **arch},
        "cluster": {"profile": profile_of(run), "num_gpus": run["cluster"]["gpus"]},
        "plan": {
            "parallel": parallel, "sequence_parallel": bool(sp),
            "pipeline": {"schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "vpp": vpp},
            "zero_stage": zero,
            "offload": _offload(bool(p.get("offload")), traits.offload),
            "recompute": {"policy": p["recompute"]},
            "batch": {"micro_batch_size": p["micro_batch"],
                      "global_batch_size": p["global_batch"]},
            "precision": dtype, "attention": "eager" if eager else "flash",
        },
    }
    return entry, assumed


def source_of(run: dict) -> str:
    """The publication a run comes from, for leave-one-source-out: its `source_id` where the
    file gives one, else the arXiv id its `source` cites, else its first URL, else the
    source's text up to its first comma-separated title."""
    if run.get("source_id"):
        return str(run["source_id"])
    source = str(run.get("source") or run["id"])
    arxiv = re.search(r"arXiv[: ]*(\d{4}\.\d{4,5})", source)
    if arxiv:
        return f"arXiv:{arxiv.group(1)}"
    url = re.search(r"https?://\S+", source)
    if url:
        return url.group(0).rstrip(".,;)")
    return source.split(";")[0].strip()[:80]


def group_of(run: dict) -> str:
    """One model on one cluster: what a search would choose among."""
    m, c = run["model"], run["cluster"]
    model = (f"{m['params']}B" if m.get("params") else
             f"L{m['layers']} h{m['hidden']} s{m['seq_len']}")
    return f"{model} on {c['gpus']} x {c.get('gpu')}"
