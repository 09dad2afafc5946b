"""Predicted against published step times of MoE training runs: DeepSeek-V3 on 2048 H800s (its
technical report), NeMo AutoModel's H100 MoE rows, and the mixture-of-experts rows of the
practitioner set (benchmarks/data/practitioner.yaml: Megatron-Core, Megatron-Bridge and the
Megatron MoE model zoo on H100). Each plan is the published layout, priced as the named runtime
runs it. This file is the one home of DeepSeek-V3's published plan (tests/unit/cost/test_moe.py
imports it). Run: python benchmarks/moe_accuracy.py"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from autoplan.cost import params
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import RuntimeTraits, load_runtime
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Precision, Recompute

HERE = Path(__file__).resolve().parent
DEEPSEEK_RUNTIME = str(HERE / "deepseek_v3_runtime.yaml")

# DeepSeek-V3 technical report (arXiv 2412.19437): §3.1 2048 H800, PP16, EP64 over 8 nodes,
# ZeRO-1, no TP; §4.2 4096-token sequences, batch 15360; 180K H800 GPU hours per trillion
# tokens (abstract, Table 1). Per step 15360 * 4096 = 62.9M tokens; the job makes
# 1e12 / (180e3 / 2048 * 3600 s) = 3.16M tokens/s, so a step takes 19.9 s.
DEEPSEEK_STEP_S = 15360 * 4096 / (1e12 / (180e3 / 2048 * 3600))
# 61 blocks on 16 stages; the report gives no split. Under DualPipe rank i holds stages i
# and 15 - i (§3.2.3: the shallowest and deepest layers on one rank), so rank 0 runs the
# embedding, 3 + 2 blocks, the output head and the MTP module with its second head (§2.2),
# and the other ranks 4 + 4 blocks. Priced as 1F1B (ONE_F_ONE_B_LAYERS) the loss stage alone
# sets the step, and a split that balances it gives it one block.
DEEPSEEK_LAYERS = (3, *([4] * 14), 2)
ONE_F_ONE_B_LAYERS = (4, *([4] * 14), 1)


@dataclass(frozen=True)
class Run:
    name: str
    plan: Plan
    runtime: str | RuntimeTraits
    published_step_s: float
    source: str


def deepseek_v3_plan(recompute: str = "selective", layers: tuple[int, ...] = DEEPSEEK_LAYERS
                     ) -> Plan:
    """The published layout. Recompute `selective` under the DeepSeek traits is the report's
    own (runtimes.SelectiveKind.DEEPSEEK_V3: norms, MLA up-projections, SwiGLU output)."""
    return Plan(model="deepseek-v3", cluster=ClusterRef("h800-sxm-80gb", 2048),
                parallel=Parallel(dp=128, pp=16, ep=64),
                pipeline=Pipeline(layers_per_stage=layers),
                batch=Batch(micro_batch_size=1, global_batch_size=15360), zero_stage=1,
                precision=Precision.FP8, recompute=Recompute(policy=recompute))


def _bench_module(name: str) -> ModuleType:
    """A script of benchmarks/ loaded by path (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def one_f_one_b_runtime() -> RuntimeTraits:
    """The DeepSeek traits with the pipeline run as 1F1B instead of DualPipe."""
    return replace(load_runtime(DEEPSEEK_RUNTIME), name="deepseek-v3-hai-llm-1f1b",
                   dualpipe=False)


def deepgemm_runtime() -> RuntimeTraits:
    """The DeepSeek traits with DeepGEMM's FP8 speed (benchmarks/deepgemm_fp8.py) in place of
    the internal CUTLASS kernels' the traits file holds."""
    eff = round(_bench_module("deepgemm_fp8").fp8_gemm_efficiency(), 3)
    return replace(load_runtime(DEEPSEEK_RUNTIME), name="deepseek-v3-hai-llm-deepgemm",
                   fp8_gemm_efficiency=eff)


def _automodel(model: str, gpus: int, gbs: int, mbs: int, ep: int) -> Plan:
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus),
                parallel=Parallel(dp=gpus, ep=ep),
                batch=Batch(micro_batch_size=mbs, global_batch_size=gbs), zero_stage=3)


AUTOMODEL = ("NeMo AutoModel performance summary (docs.nvidia.com/nemo/automodel, pre-training, "
             "DGX-H100, BF16, TE + DeepEP, FSDP2)")
REPORT = "DeepSeek-V3 report: 180K GPU hours / 1T tokens"
RUNS = (
    Run("deepseek-v3 2048 x H800 (report traits, CUTLASS FP8)", deepseek_v3_plan(),
        DEEPSEEK_RUNTIME, DEEPSEEK_STEP_S, REPORT),
    Run("deepseek-v3 2048 x H800 (report traits, DeepGEMM FP8)", deepseek_v3_plan(),
        deepgemm_runtime(), DEEPSEEK_STEP_S,
        "the same, FP8 GEMMs at DeepGEMM's speed (benchmarks/deepgemm_fp8.py)"),
    Run("deepseek-v3 2048 x H800 (report traits as 1F1B)",
        deepseek_v3_plan(layers=ONE_F_ONE_B_LAYERS), one_f_one_b_runtime(), DEEPSEEK_STEP_S,
        "the same, its pipeline priced as 1F1B (stages 4, 4 x 14, 1)"),
    Run("deepseek-v3 2048 x H800 (report traits, full recompute)", deepseek_v3_plan("full"),
        DEEPSEEK_RUNTIME, DEEPSEEK_STEP_S, "the same, whole blocks recomputed"),
    Run("deepseek-v3 2048 x H800 (megatron traits)",
        deepseek_v3_plan("full", layers=ONE_F_ONE_B_LAYERS), "megatron", DEEPSEEK_STEP_S,
        "the same run priced as Megatron's alltoall dispatcher runs it (1F1B split)"),
    # Qwen3 MoE 30B: 8 GPUs, GBS 512, MBS 4, GA 16, seq 4096, EP 8, FSDP 8: 21.773 s per step
    Run("qwen3-30b-a3b 8 x H100 (torchtitan traits)",
        _automodel("qwen3-30b-a3b", 8, 512, 4, 8), "torchtitan", 21.773, AUTOMODEL),
    # GPT-OSS 120B: 64 GPUs, GBS 512, MBS 2, GA 4, seq 4096, no EP, FSDP 64: 4.30 s per step
    Run("gpt-oss-120b 64 x H100 (torchtitan traits)",
        _automodel("gpt-oss-120b", 64, 512, 2, 1), "torchtitan", 4.30, AUTOMODEL),
)


def practitioner_module() -> ModuleType:
    """benchmarks/practitioner.py, loaded by path (benchmarks/ is not a package)."""
    return _bench_module("practitioner")


def practitioner_runs() -> list[Run]:
    """The practitioner set's configurations of MoE models, as runs of this table (a row the set
    does not score, FP8 as run, is marked so in its name)."""
    bench = practitioner_module()
    runs = []
    for entry in bench.load_data(bench.DEFAULT_DATA):
        plan, model, _ = bench.build(entry)
        if model.moe is None:
            continue
        mark = "" if entry.get("scored", True) else " (not scored)"
        runs.append(Run(entry["id"] + mark, plan, bench.row_runtime(entry),
                        entry["measured"]["step_time_s"], entry["source"]["url"]))
    return runs


def main() -> int:
    print(f"{'run':58} {'published s':>11} {'predicted s':>11} {'error':>7}  fits  largest part")
    runs = (*RUNS, *practitioner_runs())
    for run in runs:
        profile = load_profile(run.plan.cluster.profile)
        est = estimate_plan(run.plan, ClusterSpec(profile, run.plan.cluster.num_gpus),
                            runtime=run.runtime)
        err = est.step_time_s / run.published_step_s - 1.0
        fits = "yes" if est.memory["total"] <= est.memory["capacity"] else "no"
        print(f"{run.name:58} {run.published_step_s:11.2f} {est.step_time_s:11.2f} "
              f"{err:+7.1%}  {fits:4}  {est.dominant} ({est.time[est.dominant]:.2f} s)")
    print("sources:\n  " + "\n  ".join(dict.fromkeys(r.source for r in runs)))
    ds = PRESETS["deepseek-v3"]
    stored = params.mtp_params(ds) + 2 * ds.vocab_size * ds.hidden_size
    print(f"deepseek-v3 parameters: main model {params.total_params(ds) / 1e9:.1f}B (671B); "
          f"MTP module {params.mtp_params(ds) / 1e9:.2f}B unique (README_WEIGHTS.md: 11.5B), "
          f"{stored / 1e9:.2f}B with the embedding and head its checkpoint stores again "
          f"(README: 14B, 685B in all; here {(params.total_params(ds) + stored) / 1e9:.1f}B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
