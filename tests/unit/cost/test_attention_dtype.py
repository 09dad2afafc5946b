"""RuntimeTraits.attention_compute_dtype: only autoplan's CPU runtime runs a 16-bit plan's
attention core in fp32, and a bf16 plan on cpu-gloo is priced with fp32's attention figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import RUNTIMES, load_runtime
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict


def test_only_the_cpu_runtime_moves_16_bit_attention_to_fp32() -> None:
    cpu = load_runtime("autoplan-cpu")
    assert cpu.attention_compute_dtype == "fp32"
    assert [cpu.attention_precision(p) for p in ("fp32", "bf16", "fp16")] == ["fp32"] * 3
    for name in (n for n in RUNTIMES if n != "autoplan-cpu"):
        traits = load_runtime(name)
        assert traits.attention_compute_dtype is None, name
        assert [traits.attention_precision(p) for p in ("fp32", "bf16", "fp16", "fp8")] == [
            "fp32", "bf16", "fp16", "bf16"], name


def test_a_traits_file_names_a_dtype_the_runtime_cannot_compute_in(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("schema_version: 1\nname: mine\nattention_compute_dtype: fp64\n")
    with pytest.raises(ConfigError, match="attention_compute_dtype.*fp64.*fp32"):
        load_runtime(str(path))
    path.write_text("schema_version: 1\nname: mine\nattention_compute_dtype: null\n")
    assert load_runtime(str(path)).attention_compute_dtype is None


def test_a_bf16_plan_on_cpu_gloo_is_priced_at_the_fp32_kernels_speed() -> None:
    """The shipped profile's bf16 flash backward is ~16x fp32's: the upcast plan's step is
    faster than the same plan priced with bf16's kernel, and its compute time is close to
    the fp32 plan's (bf16 GEMMs run at 0.83x fp32's speed here, the casts cost a little)."""
    profile = load_profile("cpu-gloo")
    plan = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
            "parallel": {"dp": 2}, "zero_stage": 1,
            "batch": {"micro_batch_size": 4, "global_batch_size": 16}}
    cpu = load_runtime("autoplan-cpu")
    bf16 = plan_from_dict({**plan, "precision": "bf16"})
    spec = ClusterSpec(profile, 2)
    up = estimate_plan(bf16, spec, runtime=cpu).time["compute"]
    raw = estimate_plan(bf16, spec, runtime=replace(cpu, attention_compute_dtype=None))
    fp32 = estimate_plan(plan_from_dict({**plan, "precision": "fp32"}), spec,
                         runtime=cpu).time["compute"]
    assert up < 0.7 * raw.time["compute"]
    assert up == pytest.approx(fp32, rel=0.35)
