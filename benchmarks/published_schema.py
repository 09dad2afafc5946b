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
- measured_step_s: the iteration time, else tokens/s, else TFLOP/s or a share of the peak (MFU,
  HFU, % of peak) under the FLOP convention the paper states (flops_convention's text; a
  convention not recognised is not guessed at: the run is listed, not scored), else days to
  train its tokens;
- to_entry: the run as a practitioner-schema entry (benchmarks/practitioner.py builds it), with
  what it assumed where the run is silent (runtime defaults, an uneven pipeline's split).

A run with a field these rules cannot read is never priced on a guess: `why_not_priced` names the
field, and the caller lists the run with that reason.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from autoplan.cost.params import total_params
from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec, load_model

GPU_GIB = 2**30
PROFILES = Path(__file__).resolve().parents[1] / "profiles"
"""The shipped profiles: a run is priced on these, never on a user's profile of that name."""

PLAN_FIELDS = ("tp", "pp", "micro_batch", "global_batch", "recompute")
"""Plan fields a run must publish to be priced as it ran (dp follows from the GPU count)."""


MODEL_INTS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab")
PLAN_INTS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch")
MEASURED = ("iteration_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
            "hfu", "pct_peak", "memory_gb", "days", "tokens")


# --- one run's fields, checked --------------------------------------------------------------------

def _number(where: str, value: Any) -> float | None:
    """A published figure as a float (a string of one too, with a trailing B for billions);
    None for null. Anything else is a ConfigError naming the field."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ConfigError(where, f"got {value!r}", "give a number or null")
    if isinstance(value, str):
        value = value.strip().rstrip("Bb").strip()
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(where, f"got {value!r}", "give a number or null") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(where, f"got {value!r}", "give a non-negative number or null")
    return number


def _count(where: str, value: Any) -> int | None:
    """A published count (layers, degrees, batch sizes): a whole number >= 1, or None."""
    number = _number(where, value)
    if number is None:
        return None
    if number < 1 or number != int(number):
        raise ConfigError(where, f"got {value!r}", "give a whole number of at least 1 or null")
    return int(number)


def _flag(where: str, value: Any) -> bool | None:
    """true/false as YAML or as a string; None for null."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off", "none"):
        return False
    raise ConfigError(where, f"got {value!r}", "give true, false or null")


def _policy(value: Any) -> str | None:
    """The recompute policy: none | selective | full as the schema writes it; a flag for
    activation checkpointing (true / false) is the whole-block checkpointing such a flag turns
    on (Megatron-LM's --checkpoint-activations, DeepSpeed's) or none."""
    if value is None:
        return None
    text = str(value).strip().lower()
    return {"true": "full", "yes": "full", "on": "full",
            "false": "none", "no": "none", "off": "none"}.get(text, text)


def _section(run: dict, key: str, rid: str) -> dict:
    value = run.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"run {rid}: {key}", f"got {type(value).__name__}",
                          f"give the run's {key} as a mapping")
    return value


def clean(run: Any, index: int = 0) -> dict:
    """The run with every field the reading uses checked and turned into its type: counts to
    ints, figures to floats, flags to bools, texts to str (nulls kept). A field that is none
    of these is a ConfigError naming the run and the field, so one malformed run is listed,
    not priced on a guess and not the end of the file."""
    if not isinstance(run, dict):
        raise ConfigError(f"runs[{index}]", f"got {type(run).__name__}", "give each run as a mapping")
    rid = str(run.get("id") or f"runs[{index}]")
    model, cluster = _section(run, "model", rid), _section(run, "cluster", rid)
    plan, measured = _section(run, "plan", rid), run.get("measured") or {}
    if not isinstance(measured, dict):
        raise ConfigError(f"run {rid}: measured", f"got {type(measured).__name__}",
                          "give the measured figures as a mapping")
    zero = _number(f"run {rid}: plan.zero_stage", plan.get("zero_stage"))
    if zero is not None and zero not in (0, 1, 2, 3):
        raise ConfigError(f"run {rid}: plan.zero_stage", f"got {plan.get('zero_stage')!r}",
                          "give 0, 1, 2, 3 or null")
    texts = ("framework", "source", "source_id", "precision", "flops_convention", "memory_unit",
             "test_quality")
    return {
        **{k: None if run.get(k) is None else str(run[k]) for k in texts},
        "id": rid,
        "model": {**{k: _count(f"run {rid}: model.{k}", model.get(k)) for k in MODEL_INTS},
                  "params": _number(f"run {rid}: model.params", model.get("params")),
                  "moe": any(k in model for k in ("experts", "num_experts", "moe"))},
        "cluster": {"gpu": str(cluster.get("gpu") or ""),
                    "gpus": _count(f"run {rid}: cluster.gpus", cluster.get("gpus")),
                    "interconnect": str(cluster.get("interconnect") or "")},
        "plan": {**{k: _count(f"run {rid}: plan.{k}", plan.get(k)) for k in PLAN_INTS},
                 "sp": _flag(f"run {rid}: plan.sp", plan.get("sp")),
                 "offload": bool(_flag(f"run {rid}: plan.offload", plan.get("offload"))),
                 "zero_stage": None if zero is None else int(zero),
                 "recompute": _policy(plan.get("recompute"))},
        "measured": {k: _number(f"run {rid}: measured.{k}", measured.get(k)) for k in MEASURED},
    }


# --- the framework -> a runtime preset --------------------------------------------------------

ARXIV = re.compile(r"arxiv(?:\.org/(?:abs|pdf)/|[:\s]*)(\d{4}\.\d{4,5})", re.I)
"""An arXiv id as a source cites it: "arXiv 2104.04473", "arXiv:2104.04473", a URL."""


def run_year(run: dict) -> int | None:
    """The year the run's software is from: a year in its `framework` text, else a release
    named YY.MM there ("NeMo 24.07", "NGC 20.12", "Megatron-LM 23.08 container"), else the
    year of the arXiv id its `source` cites (YYMM.NNNNN), else a year in the source's text,
    else None."""
    framework, source = run.get("framework") or "", run.get("source") or ""
    year = re.search(r"\b(20[12]\d)\b", framework)
    if year:
        return int(year.group(1))
    release = re.search(r"\b(1[89]|2\d)\.(0[1-9]|1[0-2])\b", framework)
    if release:
        return 2000 + int(release.group(1))
    arxiv = ARXIV.search(source)
    if arxiv:
        return 2000 + int(arxiv.group(1)[:2])
    year = re.search(r"\b(20[12]\d)\b", source)
    return int(year.group(1)) if year else None


def runtime_of(run: dict) -> str:
    """The runtime preset that prices the run, from its framework's name:

    - nanotron, llm-foundry (MosaicML's Composer), torchtitan: their own presets (torchtitan
      0.3 and later: torchtitan-0.3's); NeMo AutoModel and plain PyTorch FSDP take torchtitan's
      (FSDP2/FSDP with SDPA, the same PyTorch parts);
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
    framework = (run.get("framework") or "").lower()
    year = run_year(run)
    if "nanotron" in framework:
        return "nanotron"
    if any(k in framework for k in ("llm-foundry", "llm foundry", "composer", "mosaic")):
        return "llm-foundry"
    release = re.search(r"torchtitan\D{0,3}(\d+)\.(\d+)", framework)
    if release and (int(release.group(1)), int(release.group(2))) >= (0, 3):
        return "torchtitan-0.3"
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
    framework = (run.get("framework") or "").lower()
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
    name = str(cluster.get("gpu") or "").upper()
    link = str(cluster.get("interconnect") or "").lower()
    # "80GB", "80 GB": a size standing apart from the family's and form's digits (SXM5 80GB)
    memory = re.search(r"(?<![A-Z0-9])(\d{2,3})\s*GB", name)
    gb = int(memory.group(1)) if memory else None
    # PCIe and NVL parts have other clocks, power and links; a Grace Hopper superchip another
    # memory system: none of them is a shipped profile's
    if re.search(r"PCI-?E|\bNVL\b|(?<![A-Z])GH\d", name):
        return None
    name = re.sub(r"[\s_-]+", "", name)
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
    text = repr(float(params))
    decimals = 0 if text.endswith(".0") else len(text.split(".")[1])
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
    # the head (vocab x hidden) apart is resolved only where the count's last digit is finer
    # than a quarter of it: Llama 3 70B's "70" (0.5B) cannot tell its 1.05B head apart
    head = shape["vocab_size"] * shape["hidden_size"]
    if half < head / 4 and abs(counts[(style, tied)] - published) > half \
            >= abs(counts[(style, not tied)] - published):
        tied = not tied
    how = (f"{style}-style, {'tied' if tied else 'untied'}: {counts[(style, tied)] / 1e9:.2f}B "
           f"parameters against the published {params:g}B")
    return {**arch, "tie_embeddings": tied}, how


def model_of(run: dict) -> ModelSpec:
    arch, _ = architecture(run)
    return load_model({**_shape(run), **arch})


# --- measured figures ---------------------------------------------------------------------------

def convention_of(text: str) -> str | None:
    """The FLOP convention a paper's `flops_convention` text names, as practitioner.py's
    flops_per_token knows them; None where it names none of these:

    - megatron-sc21: Megatron SC21 eq. 3, 96*B*s*l*h^2*(1 + s/6h + V/16lh) per iteration
      (counts the recompute forward);
    - korthikanti-eq7: Korthikanti et al. 2022 eq. 7 (model FLOPs),
      72*B*L*s*h^2*(1 + s/6h + V/12Lh);
    - palm: PaLM's (Chowdhery et al. 2022, Appendix B), 6N + 12*L*H*Q*T per token;
    - 6n: Kaplan et al. 2020 (6ND)."""
    flat = text.replace(" ", "").lower()
    if "96*b*s*l*h^2" in flat or re.search(r"eq\.?\(?3\)?(?!\d)", flat):
        return "megatron-sc21"
    if "72*b*l*s*h^2" in flat or re.search(r"eq\.?\(?7\)?(?!\d)", flat):
        return "korthikanti-eq7"
    if any(k in flat for k in ("palm", "chowdhery", "12*l*h*s", "12lhs", "12lhqt",
                               "12*l*h*q*t")):
        return "palm"
    if re.search(r"(?<![\w.])6\s*\*?\s*N(?:\s*\*?\s*D)?\b", text, re.I) or "6*params" in flat:
        return "6n"
    return None


def flops_per_token(convention: str, model: ModelSpec) -> tuple[float, str] | None:
    """(model FLOPs per trained token, the convention's name) under the count the paper's
    `flops_convention` text names (convention_of), by practitioner.py's flops_per_token; None
    where the text names none it knows."""
    import practitioner  # the sibling script: one home of the conventions' formulas

    name = convention_of(convention)
    return None if name is None else (practitioner.flops_per_token(name, model), name)


def _peak_tflops(run: dict) -> float | None:
    """The peak an MFU was stated against, where the convention's text states one: "peak 989
    TFLOP/s", "312 TFLOP/s peak", "peak: 989"."""
    text = run.get("flops_convention") or ""
    found = (re.search(r"peak[^0-9]{0,12}(\d+(?:\.\d+)?)", text, re.I)
             or re.search(r"(\d+(?:\.\d+)?)\s*TFLOP\S*\s*peak", text, re.I))
    return float(found.group(1)) if found else None


def _profile_peak_tflops(run: dict) -> float | None:
    """The dense peak of the run's profile at its precision, TFLOP/s (None without a profile)."""
    from autoplan.hardware import load_profile

    name = profile_of(run)
    if name is None:
        return None
    device = load_profile(PROFILES / f"{name}.yaml", "cluster.profile").device
    dtype = precision_of(run)
    return device.peak(dtype) / 1e12 if dtype in device.peak_flops_per_s else None


def measured_step_s(run: dict, model: ModelSpec) -> tuple[float | None, str]:
    """(seconds per optimizer step, how it was read), or (None, why not). `run` is clean()'s."""
    meas, plan, gpus = run["measured"], run["plan"], run["cluster"]["gpus"]
    if meas["iteration_time_s"]:
        return meas["iteration_time_s"], "iteration_time_s"
    if not plan["global_batch"] or not gpus:
        return None, "no global batch and GPU count to turn a rate into a step"
    tokens = plan["global_batch"] * model.seq_len
    if meas["tokens_per_s_per_gpu"]:
        return tokens / (meas["tokens_per_s_per_gpu"] * gpus), "tokens_per_s_per_gpu"
    if meas["tokens_per_s"]:
        return tokens / meas["tokens_per_s"], "tokens_per_s"
    counted = flops_per_token(run["flops_convention"] or "", model)
    if meas["tflops_per_gpu"]:
        if counted is None:
            return None, "TFLOP/s under a FLOP convention not recognised (flops_convention)"
        return tokens * counted[0] / (meas["tflops_per_gpu"] * 1e12 * gpus), \
            f"tflops_per_gpu ({counted[1]})"
    # a share of the peak: MFU, else HFU or SC21's "% of theoretical peak", each under the
    # FLOP count the convention names (SC21's eq. 3 counts the recompute forward: hardware FLOPs)
    share = next(((k, meas[k]) for k in ("mfu", "hfu", "pct_peak") if meas[k]), None)
    if share:
        if share[1] > 1.0:
            return None, f"{share[0]} {share[1]:g} is no fraction of the peak (the schema's 0-1)"
        if counted is None:
            return None, f"{share[0]} under a FLOP convention not recognised (flops_convention)"
        if share[0] != "mfu" and counted[1] != "megatron-sc21":
            # a hardware share counts the recompute's FLOPs, which only SC21's eq. 3 of the
            # conventions read here does (Korthikanti et al.'s HFU is their eq. 8, not eq. 7)
            return None, f"{share[0]} under a model-FLOPs convention ({counted[1]})"
        peak, how = _peak_tflops(run), f"{share[0]} ({counted[1]})"
        if peak is None:  # a share of the GPU's dense peak at the run's precision
            peak = _profile_peak_tflops(run)
            if peak is None:
                return None, f"{share[0]} without a stated peak or a profile to read one from"
            how = (f"{share[0]} ({counted[1]}, of the profile's {precision_of(run)} peak "
                   f"{peak:g} TFLOP/s)")
        return tokens * counted[0] / (share[1] * peak * 1e12 * gpus), how
    if meas["days"] and meas["tokens"]:
        # days to train `tokens` (NeMo Megatron's README states GPT-3 175B's so: a projection
        # from its measured step time), so one step is the step's share of them
        return meas["days"] * 86400.0 * tokens / meas["tokens"], "days (to train its tokens)"
    return None, "no iteration time, tokens/s, TFLOP/s, share of peak or days published"


def measured_memory_gib(run: dict) -> float | None:
    """The published peak memory in GiB: `memory_gb` in its `memory_unit` (GiB where the unit
    says so, else decimal GB)."""
    value = run["measured"]["memory_gb"]
    if not value:
        return None
    unit = (run["memory_unit"] or "").lower()
    return value if "gib" in unit else value * 1e9 / GPU_GIB


def memory_basis(run: dict) -> str | None:
    """The allocator counter the memory was read from, where the unit names one."""
    return "max reserved" if "reserved" in (run["memory_unit"] or "").lower() else None


# --- the run as a practitioner-schema entry -----------------------------------------------------

DEFAULT_ZERO = {"torchtitan": 3, "torchtitan-0.3": 3, "llm-foundry": 3, "nemo": 1, "megatron": 1, "deepspeed": 1,
                "nanotron": 1, "megatron-2021": 0, "megatron-2022": 0}
"""ZeRO stage where a run leaves it null and its framework's name states none ("DeepSpeed
ZeRO-3"): FSDP's full shard for the FSDP stacks (torchtitan's and llm-foundry's defaults), the
distributed optimizer NeMo's and Megatron-Core's recipes turn on, DeepSpeed's ZeRO-1 (its
pipeline engine's), nanotron's configs' zero_stage 1, and none in Megatron-LM's 2021-22 code (no
distributed optimizer yet)."""
SEQUENCE_PARALLEL_BY_DEFAULT = ("megatron-2022", "megatron", "nemo", "torchtitan", "nanotron",
                                "torchtitan-0.3")
"""Runtimes whose tensor-parallel runs shard the norms' sequence where a run leaves `sp` null:
Megatron-LM from its 2022 release and NeMo's recipes set --sequence-parallel with TP, torchtitan
always does, nanotron's REDUCE_SCATTER mode is its sweep's. Not Megatron-LM 2021 (it had none)
nor Megatron-DeepSpeed, whose 2022 runs (BLOOM) had none."""


def why_not_priced(run: dict) -> str | None:
    """Why the run (clean()'s) cannot be priced as it ran; None where it can."""
    plan, model = run["plan"], run["model"]
    missing = [f"plan.{k}" for k in PLAN_FIELDS if plan[k] is None]
    if (run["test_quality"] or "complete") != "complete":
        return f"test_quality {run['test_quality']}" + (
            f": {', '.join(missing)} not published" if missing else "")
    missing += [f"model.{k}" for k in ("layers", "hidden", "heads", "seq_len", "vocab")
                if model[k] is None]
    missing += ["cluster.gpus"] if run["cluster"]["gpus"] is None else []
    if missing:
        return f"{', '.join(missing)} not published"
    if model["moe"]:
        return "a mixture-of-experts model: the schema carries no expert fields"
    if profile_of(run) is None:
        return f"no profile for GPU {run['cluster']['gpu'] or '(none named)'}"
    return None


def _offload(offload: bool, modes: tuple[str, ...]) -> dict[str, bool]:
    """The schema's offload flag as the runtime offloads: the optimizer (ZeRO-Offload,
    Megatron's HybridDeviceOptimizer) where it can, else parameters and optimizer together
    (FSDP's CPUOffload, the only offload torchtitan and llm-foundry have)."""
    both = offload and "optimizer" not in modes and "both" in modes
    return {"optimizer": offload, "params": both}


def layer_split(layers: int, chunks: int) -> list[int] | None:
    """Blocks per pipeline chunk where `chunks` (pp * vpp) does not divide `layers`: as even as
    it goes, the end chunks, which also hold the embedding and the output layer, taking the
    fewer. So the runs that publish their split did it: Llama 3 405B, "we reduce one
    Transformer layer each from the first and the last stages" (Dubey et al. 2024 §3.3.2);
    BLOOM's Megatron-DeepSpeed partition counting the tied embedding as a block on the first
    and last stage (70 blocks on 12 stages: 5, 6 x 10, 5); Megatron-LM's
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split. None
    where the chunks divide the blocks (the runtime's even split)."""
    base, extra = divmod(layers, chunks)
    if extra == 0 or chunks == 1 or base == 0 and extra < chunks - 2:
        return None  # even, or too few blocks for every middle chunk: the plan rules say so
    split = [base] * chunks
    middle = list(range(1, chunks - 1))
    for i in (middle + [0, chunks - 1])[:extra]:  # the middle first, then the ends
        split[i] += 1
    return split


def precision_of(run: dict) -> str:
    """The plan's precision from the run's text: fp8 (FP8 GEMMs, "float8"), fp16 ("float16",
    "half"), fp32/tf32, else bf16 ("mixed precision (16-bit)" included, as the open runs were
    scored: on A100 the two 16-bit peaks are one)."""
    text = (run["precision"] or "").lower()
    if "fp8" in text or "float8" in text:
        return "fp8"
    if "fp16" in text or "float16" in text or "half" in text:
        return "fp16"
    return "fp32" if text.strip() in ("fp32", "tf32", "float32") else "bf16"


def to_entry(run: dict) -> tuple[dict[str, Any], list[str]]:
    """(the run, clean()'s, as a practitioner-schema entry; what was assumed rather than
    published)."""
    from autoplan.cost.runtimes import runtime_from_dict

    p, gpus = run["plan"], run["cluster"]["gpus"]
    missing = [f"plan.{k}" for k in ("tp", "pp") if p[k] is None]
    missing += ["cluster.gpus"] if gpus is None else []
    if missing:
        raise ConfigError(f"run {run['id']}", f"{', '.join(missing)} not published",
                          "a plan is priced only with its degrees and GPU count")
    runtime = runtime_of(run)
    traits = runtime_from_dict({"schema_version": 1, "base": runtime}, "runtime")
    arch, how = architecture(run)
    assumed = [f"runtime {runtime}" + ("" if _known_runtime(run) else " (framework unknown)"),
               how]
    tp, pp, cp = p["tp"], p["pp"], p["cp"] or 1
    if p["cp"] is None:
        assumed.append("cp 1")
    dp = p["dp"] or max(1, gpus // (tp * pp * cp))
    if p["dp"] is None:
        assumed.append(f"dp {dp} = GPUs / (tp * pp * cp)")
    zero = p["zero_stage"]
    if zero is None:
        named = re.search(r"zero[-\s]?(?:stage[-\s]?)?([0-3])", (run["framework"] or "").lower())
        zero = int(named.group(1)) if named else DEFAULT_ZERO.get(runtime, 0)
        assumed.append(f"zero_stage {zero} ("
                       + ("the framework's name" if named else f"{runtime}'s default") + ")")
    sp = p["sp"]
    if sp is None:
        sp = tp > 1 and runtime in SEQUENCE_PARALLEL_BY_DEFAULT
        assumed.append(f"sequence_parallel {sp}")
    elif sp and tp == 1:  # a recipe's flag with nothing to shard over: the run had none
        sp = False
        assumed.append("sequence_parallel False (sp with tp 1 shards nothing)")
    year = run_year(run)
    # Megatron-LM's 2021-22 code and the DeepSpeed runs of those years ran unfused softmax
    # attention; FlashAttention (2022) entered Megatron-Core, NeMo and the PyTorch stacks after
    eager = runtime in ("megatron-2021", "megatron-2022") or (
        runtime == "deepspeed" and year is not None and year <= 2022)
    vpp = p["vpp"] or 1
    pipeline: dict[str, Any] = {"schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
                                "vpp": vpp}
    split = layer_split(run["model"]["layers"], pp * vpp)
    if split is not None:
        pipeline["layers_per_stage"] = split
        assumed.append(f"layers_per_stage {split[0]}/{max(split)}/{split[-1]} (first/most/last: "
                       f"pp * vpp does not divide {run['model']['layers']}, the ends take fewer)")
    entry = {
        "id": run["id"], "runtime": runtime,
        "source": {"id": source_of(run), "title": run["source"] or run["id"]},
        "model": {**_shape(run), **arch},
        "cluster": {"profile": profile_of(run), "num_gpus": gpus},
        "plan": {
            "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": cp},
            "sequence_parallel": bool(sp),
            "pipeline": pipeline,
            "zero_stage": zero,
            "offload": _offload(p["offload"], traits.offload),
            "recompute": {"policy": p["recompute"]},
            "batch": {"micro_batch_size": p["micro_batch"],
                      "global_batch_size": p["global_batch"]},
            "precision": precision_of(run), "attention": "eager" if eager else "flash",
        },
    }
    return entry, assumed


def source_of(run: dict) -> str:
    """The publication a run comes from, for leave-one-source-out: its `source_id` where the
    file gives one, else the arXiv id its `source` cites (as text or URL), else its first URL,
    else the source's text up to its first semicolon."""
    if run["source_id"]:
        return run["source_id"]
    source = run["source"] or run["id"]
    arxiv = ARXIV.search(source)
    if arxiv:
        return f"arXiv:{arxiv.group(1)}"
    url = re.search(r"https?://\S+", source)
    if url:
        return url.group(0).rstrip(".,;)")
    return source.split(";")[0].strip()[:80]


def group_of(run: dict) -> str:
    """One model at one sequence length on one cluster: what a search would choose among
    (runs at other lengths are other work per token). The model by its shape, not its published
    parameter count, which papers round differently (SC21's 529.6B is Korthikanti et al.'s
    530B)."""
    m, c = run["model"], run["cluster"]
    model = f"L{m['layers']} h{m['hidden']} ffn{m['ffn_hidden'] or 4 * m['hidden']}"
    return f"{model} s{m['seq_len']} on {c['gpus']} x {profile_of(run) or c['gpu']}"
