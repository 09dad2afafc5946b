"""The model's RoPE base in every export: Megatron's --rotary-base (and back through the
importer), torchtitan's flavor theta or its own ComplexRoPE theta, DeepSpeed's comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.registry import get_target
from autoplan.export.torchtitan import flavor
from autoplan.model_spec import PRESETS
from autoplan.plan import Parallel

from .cases import plan
from .consumers import megatron_parser, run_script

OPTS = ExportOptions(gpus_per_node=8)
LLAMA3 = PRESETS["llama-3-8b"]


def _files(target: str, p, fmt: str = "python") -> dict[str, str]:
    opts = ExportOptions(gpus_per_node=8, torchtitan_format=fmt)
    return export_plan(get_target(target), p, p.model_spec(), opts)


def _megatron(tmp_path: Path, model) -> Path:
    p = plan(model, 8, parallel=Parallel(dp=4, tp=2), zero_stage=1)
    path = tmp_path / f"{model.name}.sh"
    path.write_text(_files("megatron", p)["megatron_args.sh"])
    return path


def test_megatron_round_trips_the_base(tmp_path: Path) -> None:
    """llama-3-8b's 500000 and llama-2-7b's 10000 are written, parsed by Megatron's own flag
    table as ints, and read back by the importer into the same model."""
    for model, base in ((LLAMA3, 500000), (PRESETS["llama-2-7b"], 10000),
                        (LLAMA3.replace(rope_theta=1e6), 1000000)):
        path = _megatron(tmp_path, model)
        [call] = run_script(path, {"torchrun": ""})
        ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
        assert ns.rotary_base == base
        back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
        assert back.model_spec().rope_theta == float(base)


def test_megatron_import_reads_the_default_base_when_absent(tmp_path: Path) -> None:
    path = _megatron(tmp_path, LLAMA3)
    path.write_text(path.read_text().replace("  --rotary-base 500000\n", ""))
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().rope_theta == 10000.0


def test_megatron_import_with_a_model_refuses_another_base(tmp_path: Path) -> None:
    """A script rotating at 10000 imported as --model llama-3-8b became a 500000 plan."""
    path = _megatron(tmp_path, LLAMA3)
    assert import_megatron(path, model="llama-3-8b", cluster="h100-sxm-80gb",
                           num_gpus=None).model_spec().rope_theta == 500000.0
    path.write_text(path.read_text().replace("  --rotary-base 500000\n", ""))
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model="llama-3-8b", cluster="h100-sxm-80gb", num_gpus=None)
    assert err.value.field.endswith("--rotary-base")
    assert err.value.problem == ("absent: Megatron's default 10000, but --model llama-3-8b "
                                 "has 500000")


def test_megatron_refuses_a_base_it_cannot_take() -> None:
    """--rotary-base is type=int in Megatron's arguments.py: a fractional base is refused."""
    model = LLAMA3.replace(rope_theta=12345.5)
    reasons = get_target("megatron").check(plan(model, 8), model, OPTS)
    assert any("model.rope_theta=12345.5" in r and "integer" in r for r in reasons)


def test_torchtitan_uses_the_flavor_only_at_its_base() -> None:
    """Llama 3's flavors rotate by 500000 with Llama 3.1's scaling: llama-3.1-8b is the 8B
    flavor; the same shape at 10000 is defined at its own shape and base (Python) and refused
    by the TOML form."""
    llama31 = PRESETS["llama-3.1-8b"]
    assert flavor(llama31) == ("8B", "llama3_8b")
    other = llama31.replace(rope_theta=10000.0)
    assert flavor(other) is None
    text = next(iter(_files("torchtitan", plan(other, 8)).values()))
    assert "theta=10000.0, scaling=" in text and "RoPE theta" not in text
    toml = get_target("torchtitan").check(plan(other, 8), other,
                                          ExportOptions(gpus_per_node=8, torchtitan_format="toml"))
    assert any("rope_theta 500000" in r for r in toml)


def test_torchtitan_custom_flavor_writes_the_base() -> None:
    model = PRESETS["llama-2-13b"].replace(rope_theta=250000.0)
    text = next(iter(_files("torchtitan", plan(model, 8)).values()))
    assert "max_seq_len=4096, theta=250000.0)" in text


def test_torchtitan_moe_flavor_base_must_match() -> None:
    qwen = PRESETS["qwen3-30b-a3b"]
    assert qwen.rope_theta == 1e6
    p = plan(qwen, 8, parallel=Parallel(dp=8))
    assert not any("rope_theta" in r for r in get_target("torchtitan").check(p, qwen, OPTS))
    other = qwen.replace(rope_theta=10000.0)
    reasons = get_target("torchtitan").check(plan(other, 8), other, OPTS)
    assert any("model.rope_theta=10000" in r and "rope_theta=1e+06" in r for r in reasons)


def test_deepspeed_names_the_base() -> None:
    """Megatron-DeepSpeed gets a comment (its flag is unchecked); DeepSpeed's own script a
    model comment with the base."""
    three_d = plan(LLAMA3, 8, parallel=Parallel(dp=4, tp=2))
    launch = _files("deepspeed", three_d)["launch.sh"]
    assert "rotates by theta 500000" in launch and "--rotary-base" not in launch
    plain = _files("deepspeed", plan(LLAMA3, 8))["launch.sh"]
    assert "rope positions (theta 500000)" in plain
