"""The practitioner set (benchmarks/data/practitioner.yaml) and the measured sweeps (MPT:
benchmarks/data/mpt-llm-foundry.yaml; BLOOM's layout search: bloom-tr11-topology.yaml;
nanotron's layout sweep: nanotron-old-bench.yaml) are
well-formed and self-consistent.

Each configuration must build a valid autoplan plan for the GPUs it ran on, cite its source,
publish only positive figures, and every figure it derives must follow from its stated formula.
How well the cost model predicts these runs is what benchmarks/practitioner.py prints; it is
not asserted here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.plan_rules import validate_plan
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "practitioner.yaml"
MPT = ROOT / "benchmarks" / "data" / "mpt-llm-foundry.yaml"
BLOOM = ROOT / "benchmarks" / "data" / "bloom-tr11-topology.yaml"
NANOTRON = ROOT / "benchmarks" / "data" / "nanotron-old-bench.yaml"


BENCH_MODULE = load_script("practitioner")
PRACTITIONER = BENCH_MODULE.load_data(DATA)
MPT_ENTRIES = BENCH_MODULE.load_data(MPT)
BLOOM_ENTRIES = BENCH_MODULE.load_data(BLOOM)
NANOTRON_ENTRIES = BENCH_MODULE.load_data(NANOTRON)
ENTRIES = PRACTITIONER + MPT_ENTRIES + BLOOM_ENTRIES + NANOTRON_ENTRIES
IDS = [e["id"] for e in ENTRIES]


def test_the_set_covers_the_sources_the_issue_names() -> None:
    ids = " ".join(e["id"] for e in PRACTITIONER)
    for needle in ("llama3-405b-8k-16384gpu", "llama3-405b-8k-8192gpu", "llama3-405b-128k",
                   "nemo-llama31-8b", "nemo-llama31-70b", "nemo-llama31-405b", "torchtitan-",
                   "zero-offload", "bloom-176b"):
        assert needle in ids, needle
    assert sum(e.get("scored", True) for e in PRACTITIONER) >= 15
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)  # ids unique across the files


@pytest.mark.parametrize("entry", MPT_ENTRIES, ids=[e["id"] for e in MPT_ENTRIES])
def test_mpt_rows_reproduce_mosaicmls_own_mfu(entry) -> None:
    """MosaicML's MFU is (6N + 12 L h s) FLOPs per token x tokens/s over the dense bf16 peak
    (the README's "MFU" section), N every parameter: the transcribed tokens/s, the model's
    parameter count and the stated MFU must agree, which checks both columns and the model
    (learned positions, biases, tied embeddings) against the table."""
    from autoplan.cost.params import total_params

    _, model, cluster = BENCH_MODULE.build(entry)
    per_token = 6 * total_params(model) + 12 * model.num_layers * model.hidden_size * model.seq_len
    mfu = entry["measured"]["tokens_per_s_per_gpu"] * per_token / cluster.profile.device.peak(
        "bf16")
    assert mfu == pytest.approx(entry["measured"]["mfu"], rel=5e-3)


@pytest.mark.parametrize("entry", BLOOM_ENTRIES, ids=[e["id"] for e in BLOOM_ENTRIES])
def test_bloom_rows_reproduce_their_own_tflops(entry) -> None:
    """The chronicles' TFLOPs are Megatron's eq. 3 (the recompute forward counted) with the
    padded vocabulary over Sec/it and 384 GPUs: the transcribed step time, model and TFLOPs
    must agree to the table's two decimals, which checks every column of the row."""
    _, model, cluster = BENCH_MODULE.build(entry)
    per_token = BENCH_MODULE.flops_per_token("megatron-sc21", model)
    tokens = entry["plan"]["batch"]["global_batch_size"] * model.seq_len
    tflops = tokens * per_token / (entry["measured"]["step_time_s"] * cluster.num_gpus) / 1e12
    assert tflops == pytest.approx(entry["measured"]["tflops_per_gpu"], abs=0.011)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_entry_builds_a_valid_plan_for_its_gpus(entry) -> None:
    plan, model, cluster = BENCH_MODULE.build(entry)
    assert plan.world_size == entry["cluster"]["num_gpus"] == cluster.num_gpus
    assert validate_plan(plan, model, cluster) == []


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_measured_figures_are_positive_and_accounted_for(entry) -> None:
    meas = entry["measured"]
    derived = entry.get("derived") or {}
    assert meas["step_time_s"] is not None, "every configuration needs a step time"
    for figure in BENCH_MODULE.MEASURED_FIGURES:
        value = meas[figure]
        if value is None:
            assert figure not in derived and figure not in meas["stated"]
            continue
        assert value > 0, figure
        assert (figure in meas["stated"]) != (figure in derived), (
            f"{figure} must be either stated by the source or derived, not both or neither")
    if meas["mfu"] is not None:
        assert meas["mfu"] < 1.0
    if meas["peak_memory_gib"] is not None:
        assert meas.get("memory_basis"), "say which memory counter the source reports"


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_entry_cites_a_url_or_a_paper(entry) -> None:
    src = entry["source"]
    assert src["title"] and src["authors"] and 2015 <= src["year"] <= 2030 and src["where"]
    url = str(src.get("url") or "")
    assert url.startswith("https://") or "arXiv" in src["where"] or "USENIX" in src["where"]
    assert entry["notes"].strip()


def test_one_publication_is_one_source_across_the_files() -> None:
    """Every entry names its publication by `source.id`; the entries of one publication share it
    whatever their titles (the tr11 README and its chronicles, the three DGX Cloud READMEs)."""
    assert all(e["source"].get("id") for e in ENTRIES)
    source = {e["id"]: BENCH_MODULE.source_id(e) for e in ENTRIES}
    assert source["bloom-176b-384a100"] == source["bloom-prelim-195b-a64-dp8-tp4-pp12-m2"]
    dgxc = {source[i] for i in IDS if i.startswith("nemo-llama31-")}
    assert len(dgxc) == 1 and len({e["source"]["title"] for e in ENTRIES
                                   if e["id"].startswith("nemo-llama31-")}) == 3


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_derived_figures_follow_from_their_formula(entry) -> None:
    _, model, _ = BENCH_MODULE.build(entry)
    for figure in entry.get("derived") or {}:
        recomputed = BENCH_MODULE.derive(entry, figure, model)
        assert recomputed == pytest.approx(entry["measured"][figure], rel=5e-3), figure


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_step_time_agrees_with_tokens_per_gpu(entry) -> None:
    meas = entry["measured"]
    if meas["tokens_per_s_per_gpu"] is None:
        pytest.skip("no tokens/s/GPU published or derived")
    _, model, _ = BENCH_MODULE.build(entry)
    tokens = entry["plan"]["batch"]["global_batch_size"] * model.seq_len
    implied = tokens / (meas["tokens_per_s_per_gpu"] * entry["cluster"]["num_gpus"])
    assert implied == pytest.approx(meas["step_time_s"], rel=0.01)


def test_nemo_llama_flops_match_nvidias_worked_example() -> None:
    """NVIDIA's README_8b.md: 8192 * (20.94e9 + 33.82e9 + 3.15e9) = 4.74e14 FLOPs per sequence."""
    from autoplan.model_spec import load_model

    model = load_model("llama-3.1-8b")
    per_sequence = model.seq_len * BENCH_MODULE.flops_per_token("nemo-llama", model)
    assert per_sequence == pytest.approx(4.74e14, rel=5e-3)


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_loader_rejects_unknown_keys_and_bad_runtimes(tmp_path: Path) -> None:
    raw = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    entry = dict(raw["configurations"][0])
    with pytest.raises(ConfigError, match="unknown keys"):
        BENCH_MODULE.load_data(_write(tmp_path, {**raw, "configurations": [
            {**entry, "tflops": 1}]}))
    with pytest.raises(ConfigError, match="runtime"):
        BENCH_MODULE.load_data(_write(tmp_path, {**raw, "configurations": [
            {**entry, "runtime": "nemo-megatron"}]}))
    with pytest.raises(ConfigError, match="appears twice"):
        BENCH_MODULE.load_data(_write(tmp_path, {**raw, "configurations": [entry, entry]}))
    with pytest.raises(ConfigError, match="schema_version"):
        BENCH_MODULE.load_data(_write(tmp_path, {**raw, "schema_version": 2}))
    with pytest.raises(ConfigError, match="runtime_traits.fused_norms"):
        BENCH_MODULE.load_data(_write(tmp_path, {**raw, "configurations": [
            {**entry, "runtime_traits": {"fused_norms": True}}]}))


def test_runtime_traits_price_the_row_with_what_its_run_set() -> None:
    """A row's runtime_traits override its preset's fields (the name stays the preset's): the
    no-AC torchtitan row keeps less with the fused RMSNorm its 2024 config chose."""
    entry = next(e for e in ENTRIES if e["id"] == "torchtitan-llama2-13b-64a100-fsdp-noac")
    assert entry["runtime_traits"] == {"fused_norm": True}
    fused = BENCH_MODULE.row_runtime(entry)
    plain = BENCH_MODULE.row_runtime({**entry, "runtime_traits": None})
    assert fused.name == plain.name == "torchtitan" and fused.fused_norm and not plain.fused_norm
    fused_row = BENCH_MODULE.score_entry(entry)
    plain_row = BENCH_MODULE.score_entry({**entry, "runtime_traits": None})
    assert fused_row["predicted_mem_gib"] < plain_row["predicted_mem_gib"] - 10.0


def test_memory_is_compared_with_the_counter_the_source_publishes() -> None:
    """torchtitan logs torch.cuda.max_memory_reserved, which holds the caching allocator's
    reserve and not the CUDA context or NCCL's buffers: the priced figure set against it is
    the total less the device's reserve outside the allocator; another counter gets the
    total."""
    entry = next(e for e in ENTRIES if e["id"] == "torchtitan-llama31-8b-8gpu-fsdp")
    assert "max reserved" in entry["measured"]["memory_basis"]
    row = BENCH_MODULE.score_entry(entry)
    _, _, cluster = BENCH_MODULE.build(entry)
    reserve = cluster.profile.device.reserved_bytes / 2**30
    assert reserve > 0
    assert row["predicted_counter_gib"] == pytest.approx(row["predicted_mem_gib"] - reserve)
    other = {**entry, "measured": {**entry["measured"], "memory_basis": "nvidia-smi, GiB"}}
    row = BENCH_MODULE.score_entry(other)
    assert row["predicted_counter_gib"] == pytest.approx(row["predicted_mem_gib"])


def test_script_prints_one_row_per_configuration_and_exits_0(capsys) -> None:
    assert BENCH_MODULE.main(["--format", "json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["configurations"]] == [e["id"] for e in PRACTITIONER]
    assert out["scored"] == sum(e.get("scored", True) for e in PRACTITIONER)
    assert all(r["predicted_s"] > 0 for r in out["configurations"])
    assert BENCH_MODULE.main(["--format", "json", "--data", str(MPT)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["configurations"]] == [e["id"] for e in MPT_ENTRIES]


def test_script_reports_a_malformed_file_in_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nconfigurations: [{id: x}]\n", encoding="utf-8")
    assert BENCH_MODULE.main(["--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing keys" in err


@pytest.mark.parametrize("entry", NANOTRON_ENTRIES, ids=[e["id"] for e in NANOTRON_ENTRIES])
def test_nanotron_rows_reproduce_nanotrons_own_tflops(entry) -> None:
    """nanotron logs model_tflops_per_gpu = get_flops (models/llama.py, full s^2 attention) x
    tokens/s/GPU: the transcribed throughput, the model and the 4096-token sequence (which the
    logs do not print; the sweep's generator sets it) must give the logged TFLOP/s to the CSV's
    three figures. At 2048 tokens the same rows would log 13% less."""
    _, model, _ = BENCH_MODULE.build(entry)
    per_token = BENCH_MODULE.flops_per_token("nanotron", model)
    tflops = entry["measured"]["tokens_per_s_per_gpu"] * per_token / 1e12
    assert tflops == pytest.approx(entry["measured"]["tflops_per_gpu"], rel=0.01)
    assert per_token == pytest.approx(9.074e9, rel=1e-3)
