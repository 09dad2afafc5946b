"""benchmarks/published_schema.py: a run of the published schema read as its software ran it.

A file of runs from elsewhere comes in tests/data/published/published-open.yaml's schema, which
names a framework, a GPU and a model's shape but no runtime preset, profile or architecture:
these tests hold each reading rule, and hold the runs of tests/data/published/schema-cases.yaml
(practitioner-set runs written in that schema) to the prices the practitioner set gives them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan.model_spec import load_model
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[3]
OPEN = ROOT / "tests" / "data" / "published" / "published-open.yaml"
CASES = ROOT / "tests" / "data" / "published" / "schema-cases.yaml"


@pytest.fixture(scope="module")
def schema():
    return load_script("published_schema")


@pytest.fixture(scope="module")
def bench():
    return load_script("published_accuracy")


def _run(**fields) -> dict:
    """A run of the schema with `fields` over a Llama 3 8B FSDP run, as clean() reads it."""
    return load_script("published_schema").clean(_raw(**fields))


def _raw(**fields) -> dict:
    run = {"id": "r", "framework": "", "source": "", "precision": "bf16",
           "model": {"params": None, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                     "ffn_hidden": 14336, "seq_len": 8192, "vocab": 128256},
           "cluster": {"gpu": "H100-SXM5-80GB", "gpus": 8},
           "plan": {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "zero_stage": 3,
                    "recompute": "full", "micro_batch": 1, "global_batch": 8},
           "measured": {}}
    for key, value in fields.items():
        run[key] = {**run[key], **value} if isinstance(value, dict) else value
    return run


@pytest.mark.parametrize("framework, source, zero, runtime", [
    ("Megatron-LM (2021, PyTorch NGC 20.12)", "", 0, "megatron-2021"),
    ("Megatron-LM (2022)", "", 0, "megatron-2022"),
    ("Megatron-LM (+DeepSpeed ZeRO-3 for zero3 rows)", "SC21, arXiv 2104.04473", 0,
     "megatron-2021"),
    ("Megatron-LM (+DeepSpeed ZeRO-3 for zero3 rows)", "SC21, arXiv 2104.04473", 3, "deepspeed"),
    ("Megatron-DeepSpeed", "BigScience 2022", 1, "deepspeed"),
    ("Megatron-LM", "MegaScale, arXiv 2402.15627", 1, "megatron"),
    ("Megatron-Core 0.9", "", 1, "megatron"),
    ("NeMo 24.09", "", 1, "nemo"),
    ("Megatron-Bridge", "NVIDIA performance summary 2025", 1, "nemo"),
    ("NeMo Megatron (2022)", "", 0, "megatron-2022"),
    ("torchtitan", "", 3, "torchtitan"),
    ("torchtitan 0.2.0", "", 3, "torchtitan"),
    ("torchtitan v0.3.0", "", 3, "torchtitan-0.3"),
    ("NeMo AutoModel (FSDP2)", "", 3, "torchtitan"),
    ("PyTorch FSDP", "", 3, "torchtitan"),
    ("MosaicML llm-foundry (Composer)", "", 3, "llm-foundry"),
    ("nanotron", "", 1, "nanotron"),
    ("an in-house stack", "", 1, "megatron"),
])
def test_the_framework_names_the_runtime(schema, framework, source, zero, runtime) -> None:
    run = _run(framework=framework, source=source, plan={"zero_stage": zero})
    assert schema.runtime_of(run) == runtime


def test_the_year_comes_from_the_framework_then_the_paper(schema) -> None:
    # the paper's arXiv id before a later year its source mentions (a repository's scripts)
    run = _run(framework="Megatron-LM", source="arXiv 2205.05198; scripts from the 2023 repo")
    assert schema.run_year(run) == 2022 and schema.runtime_of(run) == "megatron-2022"
    assert schema.run_year(_run(framework="Megatron-LM 23.08 container")) == 2023
    assert schema.run_year(_run(framework="Megatron-LM (2021, PyTorch NGC 20.12)")) == 2021


def test_what_the_plan_leaves_null_is_read_from_the_framework_and_said(schema) -> None:
    entry, assumed = schema.to_entry(_run(framework="DeepSpeed ZeRO-3",
                                          plan={"zero_stage": None, "tp": 2, "dp": 4}))
    assert entry["plan"]["zero_stage"] == 3
    assert "zero_stage 3 (the framework's name)" in assumed
    # Megatron-DeepSpeed's runs had no Megatron-style sequence parallelism; NeMo's recipes do
    assert not entry["plan"]["sequence_parallel"] and "sequence_parallel False" in assumed
    entry, assumed = schema.to_entry(_run(framework="NeMo 24.09",
                                          plan={"zero_stage": None, "tp": 2, "dp": 4}))
    assert entry["plan"]["sequence_parallel"] and entry["plan"]["zero_stage"] == 1
    assert "zero_stage 1 (nemo's default)" in assumed


def test_sequence_parallel_without_tensor_parallelism_is_read_as_none(schema) -> None:
    """NeMo's recipes may carry sequence_parallel true at tp 1, where it shards nothing; the
    plan rules refuse sp without tp, so it is read as off, and said."""
    entry, assumed = schema.to_entry(_run(framework="NeMo 24.09", plan={"sp": True}))
    assert entry["plan"]["sequence_parallel"] is False
    assert "sequence_parallel False (sp with tp 1 shards nothing)" in assumed


def test_an_unknown_framework_is_priced_as_megatron_core_and_says_so(schema) -> None:
    _, assumed = schema.to_entry(_run(framework="an in-house stack"))
    assert assumed[0] == "runtime megatron (framework unknown)"
    _, assumed = schema.to_entry(_run(framework="torchtitan"))
    assert assumed[0] == "runtime torchtitan"


@pytest.mark.parametrize("gpu, interconnect, profile", [
    ("A100-SXM4-80GB", "", "a100-sxm4-80gb"),
    ("A100 80GB", "Omni-Path 100 Gb/s x 4", "a100-80gb-opa"),
    ("A100-SXM4-40GB", "", "a100-sxm4-40gb"),
    ("A100-PCIE-40GB", "", None),
    ("H100-SXM5-80GB", "", "h100-sxm-80gb"),
    ("H100 80GB HBM3", "", "h100-sxm-80gb"),
    ("H100-SXM5-96GB", "", "h100-96gb-500w"),
    ("H100 SXM5 80GB", "", "h100-sxm-80gb"),
    ("NVIDIA H100 SXM5 80GB HBM3", "", "h100-sxm-80gb"),
    ("H100_SXM5_80GB", "", "h100-sxm-80gb"),
    ("NVIDIA A100 SXM4 40GB", "", "a100-sxm4-40gb"),
    ("H100 NVL", "", None),
    ("H200-SXM-141GB", "", "h200-sxm-141gb"),
    ("H800", "", "h800-sxm-80gb"),
    ("V100-SXM2-32GB", "", "v100-sxm2-32gb"),
    ("V100-SXM2-16GB", "", None),
    ("GH200", "", None),
    ("NVIDIA GH200 96GB", "", None),
    ("MI300X", "", None),
])
def test_the_gpu_name_picks_a_shipped_profile_or_none(schema, gpu, interconnect, profile) -> None:
    run = _run(cluster={"gpu": gpu, "interconnect": interconnect})
    assert schema.profile_of(run) == profile
    if profile is not None:
        assert (ROOT / "profiles" / f"{profile}.yaml").is_file()


def test_the_architecture_is_the_one_whose_count_matches_the_published_one(schema) -> None:
    llama8b = _run(model={"params": 8.0})
    arch, how = schema.architecture(llama8b)
    assert arch["mlp"] == "swiglu" and arch["norm"] == "rmsnorm" and not arch["tie_embeddings"]
    assert how.startswith("llama-style, untied: 8.03B")
    gpt175 = _run(model={"params": 174.6, "layers": 96, "hidden": 12288, "heads": 96,
                         "kv_heads": None, "ffn_hidden": 49152, "seq_len": 2048,
                         "vocab": 51200})
    arch, how = schema.architecture(gpt175)
    assert arch["mlp"] == "gelu" and arch["tie_embeddings"] and how.startswith(
        "gpt-style, tied: 174.62B")
    # rounded to 175 the untied count (175.25B) is no worse a match: the style's own (tied) holds
    arch, _ = schema.architecture(_run(model={**gpt175["model"], "params": 175}))
    assert arch["tie_embeddings"]
    # Llama 3 70B published as "70": its last digit (0.5B) cannot tell the 1.05B head apart,
    # though tied (69.50B) sits nearer than untied (70.55B): Llama's own (untied) holds
    arch, _ = schema.architecture(_run(model={"params": 70, "layers": 80, "hidden": 8192,
                                              "heads": 64, "ffn_hidden": 28672}))
    assert arch["mlp"] == "swiglu" and not arch["tie_embeddings"]
    # a tied Llama-style model whose count says so (1.24B with the head shared)
    small = _run(model={"params": 1.24, "layers": 16, "hidden": 2048, "heads": 32,
                        "kv_heads": 8, "ffn_hidden": 8192, "vocab": 128256})
    arch, _ = schema.architecture(small)
    assert arch["mlp"] == "swiglu" and arch["tie_embeddings"]


def test_without_a_count_the_ffn_width_decides(schema) -> None:
    assert schema.architecture(_run())[0]["mlp"] == "swiglu"  # 14336 = 3.5 h
    gpt = _run(model={"ffn_hidden": 16384})  # 4 h
    assert schema.architecture(gpt)[0]["mlp"] == "gelu"
    assert schema.architecture(_run(model={"ffn_hidden": None}))[0]["mlp"] == "gelu"


def test_the_measured_step_comes_from_what_was_published(schema) -> None:
    from autoplan.cost.params import total_params

    def step(measured: dict, convention: str | None = None) -> tuple[float | None, str]:
        run = _run(plan={"global_batch": 16}, measured=measured, flops_convention=convention)
        return schema.measured_step_s(run, schema.model_of(run))

    model = schema.model_of(_run())
    tokens = 16 * 8192
    assert step({"iteration_time_s": 3.5}) == (3.5, "iteration_time_s")
    seconds, how = step({"tokens_per_s_per_gpu": 5762})
    assert seconds == pytest.approx(tokens / (5762 * 8)) and how == "tokens_per_s_per_gpu"
    seconds, how = step({"tokens_per_s": "46096"})  # a figure written as a string
    assert seconds == pytest.approx(tokens / 46096) and how == "tokens_per_s"
    # TFLOP/s under PaLM's count, 6N + 12 L H Q T per token, as PaLM writes it
    seconds, how = step({"tflops_per_gpu": 400}, "PaLM Appendix B: 6N + 12LHQT")
    per_token = 6 * total_params(model) + 12 * 32 * 4096 * 8192
    assert seconds == pytest.approx(tokens * per_token / (400e12 * 8))
    assert how == "tflops_per_gpu (palm)"
    # MFU with the peak it was stated against, in either order
    for convention in ("6*N per token, peak 989 TFLOP/s", "6ND against 989 TFLOP/s peak"):
        seconds, how = step({"mfu": 0.4}, convention)
        assert seconds == pytest.approx(tokens * 6 * total_params(model) / (0.4 * 989e12 * 8))
        assert how == "mfu (6n)"
    # no peak stated: the run's GPU's dense peak at its precision (the H100 profile's bf16)
    seconds, how = step({"mfu": 0.4}, "6N")
    assert seconds == pytest.approx(tokens * 6 * total_params(model) / (0.4 * 989e12 * 8))
    assert how == "mfu (6n, of the profile's bf16 peak 989 TFLOP/s)"
    # SC21's "% of theoretical peak" alone, against its stated 312 TFLOP/s, under eq. 3
    seconds, how = step({"pct_peak": 0.44}, "Megatron eq. (3), peak 312 TFLOP/s")
    eq3 = 96 * 32 * 4096**2 * (1 + 8192 / (6 * 4096) + 128256 / (16 * 32 * 4096))
    assert seconds == pytest.approx(tokens * eq3 / (0.44 * 312e12 * 8))
    assert how == "pct_peak (megatron-sc21)"
    # days to train a number of tokens (NeMo's GPT-3 175B README: 300B tokens in 24 days)
    seconds, how = step({"days": 24, "tokens": 300e9})
    assert seconds == pytest.approx(24 * 86400 * tokens / 300e9)
    assert how == "days (to train its tokens)"


def test_a_hardware_share_is_read_only_under_a_hardware_flop_count(schema) -> None:
    """HFU counts the recompute's FLOPs: SC21's eq. 3 does, Korthikanti et al.'s eq. 7 (model
    FLOPs; their HFU is eq. 8) does not, so an HFU under it is listed, not read 4/3 short."""
    run = _run(measured={"hfu": 0.5}, flops_convention="MFU from eq. (7), HFU from eq. (8)")
    seconds, why = schema.measured_step_s(run, schema.model_of(run))
    assert seconds is None and why == "hfu under a model-FLOPs convention (korthikanti-eq7)"
    run = _run(measured={"hfu": 0.5}, flops_convention="Megatron eq. (3), peak 312 TFLOP/s")
    assert schema.measured_step_s(run, schema.model_of(run))[1] == "hfu (megatron-sc21)"


def test_days_without_their_tokens_give_no_step(schema) -> None:
    run = _run(measured={"days": 24})
    assert schema.measured_step_s(run, schema.model_of(run)) == (
        None, "no iteration time, tokens/s, TFLOP/s, share of peak or days published")


def test_a_share_of_the_peak_above_one_is_not_read_as_a_fraction(schema) -> None:
    run = _run(measured={"mfu": 43}, flops_convention="6N, peak 989 TFLOP/s")
    seconds, why = schema.measured_step_s(run, schema.model_of(run))
    assert seconds is None and why == "mfu 43 is no fraction of the peak (the schema's 0-1)"


def test_a_checkpointing_flag_is_read_as_a_policy(schema) -> None:
    assert _run(plan={"recompute": True})["plan"]["recompute"] == "full"
    assert _run(plan={"recompute": "false"})["plan"]["recompute"] == "none"
    assert _run(plan={"recompute": "Selective"})["plan"]["recompute"] == "selective"


def test_a_flop_count_it_cannot_read_is_not_guessed(schema) -> None:
    run = _run(measured={"tflops_per_gpu": 400}, flops_convention="the vendor's own count")
    seconds, why = schema.measured_step_s(run, schema.model_of(run))
    assert seconds is None and "not recognised" in why


@pytest.mark.parametrize("text, name", [
    ("Megatron eq. (3): 96*B*s*l*h^2*(...)", "megatron-sc21"),
    ("Megatron eq. 3 (includes recompute forward)", "megatron-sc21"),
    ("Appendix A eq. (7) model FLOPs", "korthikanti-eq7"),
    ("6N + 12*L*H*Q*T (PaLM)", "palm"),
    ("6 * N * D", "6n"),
    ("eq. (30) of some paper", None),
])
def test_flop_conventions_are_read_from_their_text(schema, text, name) -> None:
    counted = schema.flops_per_token(text, schema.model_of(_run()))
    assert (counted and counted[1]) == name


def test_korthikanti_eq7_counts_model_flops(schema) -> None:
    """Korthikanti et al. 2022, Appendix A eq. 7: 72 B L s h^2 (1 + s/6h + V/12Lh), which is
    eq. 3 of SC21 without the recompute forward's share: 3/4 of it at V -> 0."""
    model = load_model({"name": "m", "num_layers": 96, "hidden_size": 12288, "num_heads": 96,
                        "vocab_size": 1, "seq_len": 2048})
    eq7, name = schema.flops_per_token("Appendix A eq. (7) model FLOPs", model)
    eq3, _ = schema.flops_per_token("eq. (3)", model)
    assert name == "korthikanti-eq7" and eq7 / eq3 == pytest.approx(0.75, rel=1e-4)


def test_memory_is_read_in_its_unit(schema) -> None:
    assert schema.measured_memory_gib(_run(measured={"memory_gb": 80.0},
                                           memory_unit="GB")) == pytest.approx(80e9 / 2**30)
    run = _run(measured={"memory_gb": 82.4}, memory_unit="GiB (torch.cuda.max_memory_reserved)")
    assert schema.measured_memory_gib(run) == 82.4
    assert schema.memory_basis(run) == "max reserved"
    assert schema.measured_memory_gib(_run(measured={"memory_gb": None})) is None


def test_the_source_is_the_publication(schema) -> None:
    assert schema.source_of(_run(source="Narayanan et al. (SC21, arXiv 2104.04473), Table 1")) \
        == "arXiv:2104.04473"
    assert schema.source_of(_run(source="https://arxiv.org/abs/2104.04473v2")) \
        == "arXiv:2104.04473"
    assert schema.source_of(_run(source="torchtitan docs; https://github.com/pytorch/torchtitan."
                                 )) == "https://github.com/pytorch/torchtitan"
    assert schema.source_of(_run(source_id="mine", source="x")) == "mine"


def test_the_open_file_as_shipped_upstream_scores_the_same(bench, tmp_path: Path) -> None:
    """The schema's own file carries no source_id: each run's source is then the arXiv id it
    cites, and every price is the same."""
    data = yaml.safe_load(OPEN.read_text())
    for run in data["runs"]:
        del run["source_id"]
    upstream = tmp_path / "published-open.yaml"
    upstream.write_text(yaml.safe_dump(data))
    ours = {r["id"]: r for r in bench.score(OPEN)}
    theirs = {r["id"]: r for r in bench.score(upstream)}
    assert ours.keys() == theirs.keys() and len(ours) == 25
    assert all(theirs[k]["predicted_s"] == ours[k]["predicted_s"] for k in ours)
    assert {r["source"] for r in theirs.values()} == {"arXiv:2104.04473", "arXiv:2205.05198"}


def test_runs_of_other_stacks_price_as_the_practitioner_set_prices_them(bench) -> None:
    """Where the schema carries everything a practitioner row states (no runtime_traits, no
    layer split), the reading is that row: same runtime, profile, plan and price."""
    practitioner = load_script("practitioner")
    rows = {r["id"]: r for r in bench.score(CASES)}
    assert set(rows) == {"torchtitan-llama31-8b-8gpu-fsdp", "megascale-175b-256gpu-gbs768"}
    for entry in practitioner.load_data(practitioner.DEFAULT_DATA):
        if entry["id"] in rows:
            row, theirs = rows[entry["id"]], practitioner.score_entry(entry)
            assert (row["runtime"], row["profile"], row["plan"]) == (
                theirs["runtime"], theirs["profile"], theirs["plan"])
            assert row["predicted_s"] == pytest.approx(theirs["predicted_s"], rel=1e-9)
            assert row["measured_s"] == pytest.approx(theirs["measured_s"], rel=1e-4)
    torchtitan = rows["torchtitan-llama31-8b-8gpu-fsdp"]
    assert torchtitan["measured_mem_gib"] == 82.4
    assert torchtitan["memory_error"] == pytest.approx(torchtitan["predicted_mem_gib"] / 82.4 - 1)
    assert bench.memory_summary(list(rows.values())) == {
        "runs": 1, "median_abs_error": abs(torchtitan["memory_error"]), "predicted_to_fit": 1}


def test_runs_it_cannot_price_are_listed_with_the_reason(bench, tmp_path: Path, capsys) -> None:
    skipped = {s["id"]: s["reason"] for s in bench.not_scored(CASES)}
    assert skipped == {
        "on-mi300x": "no profile for GPU MI300X",
        "mixtral-moe": "a mixture-of-experts model: the schema carries no expert fields",
        "no-micro-batch": "plan.micro_batch not published",
    }
    # a plan the cost model refuses is listed with the refusal, not raised
    data = yaml.safe_load(CASES.read_text())
    bad = {**data["runs"][0], "id": "odd-policy",
           "plan": {**data["runs"][0]["plan"], "recompute": "sometimes"}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [bad]}))
    assert bench.score(path) == []
    (reason,) = [s["reason"] for s in bench.not_scored(path)]
    assert reason.startswith("the plan as read is refused: recompute.policy: got 'sometimes'")
    assert bench.main(["--data", str(path), "--no-practitioner"]) == 0
    assert "odd-policy" in capsys.readouterr().out


@pytest.mark.parametrize("broken", [
    {"id": "no-heads", "test_quality": "partial", "model": {"heads": None}},
    {"id": "heads-not-dividing", "model": {"heads": 60, "kv_heads": 7}},
    {"id": "float-layers", "model": {"layers": 32.5}},
    {"id": "infinite-gpus", "cluster": {"gpus": float("inf")}},
    {"id": "huge-figure", "plan": {"recompute": None}, "measured": {"tokens_per_s": 10**400}},
    {"id": "gpus-null", "cluster": {"gpus": None}},
    {"id": "gpus-text", "cluster": {"gpus": "eight"}},
    {"id": "tp-zero", "plan": {"tp": 0}},
    {"id": "sp-text", "plan": {"sp": "maybe"}},
    {"id": "mfu-no-convention", "plan": {"recompute": None}, "measured": {"mfu": 0.4}},
    {"id": "no-measured", "measured": None},
])
def test_a_run_it_cannot_read_is_listed_and_the_rest_scored(bench, tmp_path: Path, capsys,
                                                            broken) -> None:
    """One malformed run among good ones: exit 0, the good run scored, the other listed with
    the field that stopped it (a file of runs from elsewhere is never stopped by one run)."""
    data = yaml.safe_load(CASES.read_text())
    good = data["runs"][0]
    bad = {**good, **{k: v for k, v in broken.items() if not isinstance(v, dict)}}
    for key in ("model", "cluster", "plan", "measured"):
        if isinstance(broken.get(key), dict):
            bad[key] = {**good[key], **broken[key]}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [good, bad]}))
    assert bench.main(["--data", str(path), "--no-practitioner"]) == 0
    out = capsys.readouterr().out
    assert "1 of the 2 runs of runs.yaml scored" in out
    listed = out.split("not scored: 1 runs")[1]
    assert broken["id"] in listed


def test_figures_written_as_text_are_read(schema) -> None:
    run = _run(model={"params": "8.0B"}, cluster={"gpus": "8"}, plan={"sp": "false"},
               measured={"tokens_per_s": "46096"})
    assert run["model"]["params"] == 8.0 and run["cluster"]["gpus"] == 8
    assert run["plan"]["sp"] is False and run["measured"]["tokens_per_s"] == 46096.0


def test_a_file_without_runs_is_a_one_line_error(bench, tmp_path: Path, capsys) -> None:
    path = tmp_path / "runs.yaml"
    path.write_text("title: neither runs nor configurations\n")
    assert bench.main(["--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "has no list of runs under `runs`" in err


def test_offload_is_read_as_the_runtime_offloads(schema) -> None:
    """The schema's one offload flag: FSDP's CPUOffload moves parameters with the optimizer
    (torchtitan's only mode), DeepSpeed's ZeRO-Offload and Megatron's the optimizer alone."""
    fsdp, _ = schema.to_entry(_run(framework="torchtitan", plan={"offload": True}))
    assert fsdp["plan"]["offload"] == {"optimizer": True, "params": True}
    zero, _ = schema.to_entry(_run(framework="DeepSpeed", plan={"offload": True}))
    assert zero["plan"]["offload"] == {"optimizer": True, "params": False}
    off, _ = schema.to_entry(_run(framework="torchtitan"))
    assert off["plan"]["offload"] == {"optimizer": False, "params": False}


def test_a_plan_its_runtime_cannot_run_is_listed_not_counted_unfit(bench, tmp_path: Path) -> None:
    """llm-foundry has no tensor parallelism: a run read as llm-foundry with tp 2 is no
    prediction of that run (the reading or the file is wrong), so it is listed with the
    runtime's refusal rather than scored as "predicted not to fit"."""
    data = yaml.safe_load(CASES.read_text())
    run = {**data["runs"][0], "id": "foundry-tp2", "framework": "MosaicML llm-foundry",
           "plan": {**data["runs"][0]["plan"], "tp": 2, "dp": 4}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [run]}))
    assert bench.score(path) == []
    (row,) = bench.not_scored(path)
    assert row["reason"] == ("the plan as read is refused: runtime llm-foundry cannot split the "
                             "model by tp=2 (it runs data parallelism and ZeRO sharding only)")


@pytest.mark.parametrize("layers, chunks, split", [
    (96, 8, None), (70, 12, [5] + [6] * 10 + [5]), (126, 16, [7] + [8] * 14 + [7]),
    (126, 128, [0] + [1] * 126 + [0]), (10, 4, [2, 3, 3, 2]), (3, 4, [1, 1, 1, 0]),
    (24, 16, [1] + [2] * 8 + [1] * 7), (5, 1, None),
    (24, 32, None),  # too few blocks for every middle chunk: the plan rules refuse it by name
])
def test_an_uneven_pipeline_gives_the_ends_fewer_blocks(schema, layers, chunks, split) -> None:
    got = schema.layer_split(layers, chunks)
    assert got == split
    assert got is None or (sum(got) == layers and len(got) == chunks)


def test_an_uneven_run_is_scored_with_the_split_and_says_so(bench, tmp_path: Path) -> None:
    """Llama 3 405B's 126 blocks on 16 stages: refused by the plan rules without a split,
    scored with the ends-fewer one, which the row names."""
    data = yaml.safe_load(CASES.read_text())
    run = {**data["runs"][0], "id": "uneven", "cluster": {"gpu": "H100-SXM5-80GB", "gpus": 256},
           "model": {"params": 405, "layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8,
                     "ffn_hidden": 53248, "seq_len": 8192, "vocab": 128256},
           "plan": {**data["runs"][0]["plan"], "tp": 8, "pp": 16, "dp": 2, "zero_stage": 1,
                    "recompute": "full", "micro_batch": 1, "global_batch": 64},
           "framework": "Megatron-Core", "measured": {"iteration_time_s": 60.0}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [run]}))
    (row,) = bench.score(path)
    assert "layers_per_stage 7/8/7 (first/most/last: pp * vpp does not divide 126, the ends " \
        "take fewer)" in row["assumed"]


def test_a_run_without_its_gpu_count_is_listed_under_either_policy(bench, tmp_path: Path) -> None:
    """A run that leaves the recompute policy out is priced under none and full beside its
    measured step, but not without a GPU count: listed, not raised (a crash before)."""
    data = yaml.safe_load(CASES.read_text())
    run = {**data["runs"][0], "id": "no-gpus", "cluster": {"gpu": "H100-SXM5-96GB", "gpus": None},
           "plan": {**data["runs"][0]["plan"], "dp": None, "recompute": None}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [run]}))
    (row,) = bench.not_scored(path)
    assert row["reason"] == "plan.recompute, cluster.gpus not published" and not row["predicted"]


def test_the_memory_summary_takes_the_median(bench) -> None:
    rows = [{"measured_mem_gib": 80.0, "memory_error": e, "feasible": f}
            for e, f in ((-0.1, True), (0.3, True), (0.2, False), (-0.05, True))]
    assert bench.memory_summary(rows) == {"runs": 4, "median_abs_error": pytest.approx(0.15),
                                          "predicted_to_fit": 3}
    assert bench.memory_summary([{"measured_mem_gib": None}]) == {
        "runs": 0, "median_abs_error": None, "predicted_to_fit": 0}


def test_the_json_report_carries_the_memory_summary(bench, capsys) -> None:
    assert bench.main(["--data", str(CASES), "--no-practitioner", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["memory"]["runs"] == 1 and report["memory"]["predicted_to_fit"] == 1


def test_bloom_s_layouts_read_back_from_the_schema_at_their_own_price() -> None:
    """schema_fidelity writes a practitioner row in the published schema and reads it back:
    BLOOM's 17 layouts (Megatron-DeepSpeed, 2022, uneven pipelines, Omni-Path) carry all they
    state, so each prices as its row does."""
    fidelity = load_script("schema_fidelity")
    rows = fidelity.compare((ROOT / "benchmarks" / "data" / "bloom-tr11-topology.yaml",))
    assert len(rows) == 17 and not any(r["listed"] for r in rows)
    assert fidelity.summary(rows)["all"]["same_price"] == 17


def test_the_uneven_split_is_the_one_the_published_runs_state() -> None:
    """Every practitioner-set split of Llama 3's, Megatron-Bridge's, the MoE model zoo's and
    BLOOM's layouts (31 rows, the sources' own or read off their schedules) is the rule's:
    ends fewer. torchtitan's (the last two stages fewer) and nanotron's (its own block costs)
    are their own."""
    practitioner, schema = load_script("practitioner"), load_script("published_schema")
    bench = load_script("published_accuracy")
    matched, own = [], []
    for path in (practitioner.DEFAULT_DATA, *bench.SWEEPS):
        for entry in practitioner.load_data(path):
            stated = entry["plan"].get("pipeline", {}).get("layers_per_stage")
            if not stated:
                continue
            plan, model, _ = practitioner.build(entry)
            ours = schema.layer_split(model.num_layers, plan.parallel.pp * plan.pipeline.vpp)
            (matched if ours == list(stated) else own).append(entry["id"])
    assert len(matched) == 31
    assert {i.split("-")[0] for i in own} == {"torchtitan", "nanotron"}


def test_a_file_of_the_practitioner_schema_is_scored_as_practitioner_py_scores_it(bench) -> None:
    practitioner = load_script("practitioner")
    path = ROOT / "benchmarks" / "data" / "bloom-tr11-topology.yaml"
    rows, listed = bench.read(path)
    ours = {e["id"]: practitioner.score_entry(e) for e in practitioner.load_data(path)}
    assert len(rows) == len(ours) == 17 and listed == []
    assert all(r["predicted_s"] == ours[r["id"]]["predicted_s"] for r in rows)
    assert all(r["runtime"] == "deepspeed" and r["source"] == "bigscience-tr11-176b" for r in rows)
