"""Recompute by module and Megatron's uniform method through the exporters and importers:
Megatron's flag definitions parse the arguments, Megatron-Core's TransformerConfig validates
them, import reads them back; the other targets write what they can and refuse the rest."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.megatron_args import flag_values
from autoplan.export.registry import get_target
from autoplan.plan import (
    Attention,
    Batch,
    Parallel,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    plan_from_dict,
)
from autoplan.plan_files import load_plan, plan_to_dict, save_plan

from .cases import plan
from .consumers import megatron_parser, run_script, torchrun_args
from .test_megatron import transformer_config

M = RecomputeModule
SEL, FULL = RecomputePolicy.SELECTIVE, RecomputePolicy.FULL
OPTS = ExportOptions(gpus_per_node=8)
MEGATRON_PLANS = {
    "modules-core-mlp": Recompute(policy=SEL, modules=(M.CORE_ATTN, M.MLP)),
    "modules-layernorm": Recompute(policy=SEL, modules=(M.LAYERNORM,)),
    "uniform-4": Recompute(policy=FULL, num_layers=4, method=RecomputeMethod.UNIFORM),
}


def _plan(rc: Recompute):
    return plan("gpt3-13b", 16, parallel=Parallel(dp=2, tp=8), sequence_parallel=True,
                zero_stage=1, recompute=rc, batch=Batch(1, 64))


def _megatron_args(tmp_path: Path, p) -> tuple[Path, list[str]]:
    files = export_plan(get_target("megatron"), p, p.model_spec(), OPTS)
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    [call] = run_script(path, {"torchrun": ""})
    return path, torchrun_args(call[1:]).training_script_args


@pytest.mark.parametrize("name", list(MEGATRON_PLANS))
def test_megatron_reads_validates_and_round_trips(tmp_path: Path, name: str):
    rc = MEGATRON_PLANS[name]
    p = _plan(rc)
    path, argv = _megatron_args(tmp_path, p)
    ns = megatron_parser().parse_args(argv)
    assert ns.recompute_modules == ([m.value for m in rc.modules] if rc.modules else None)
    if rc.method == RecomputeMethod.UNIFORM:
        assert (ns.recompute_method, ns.recompute_num_layers) == ("uniform", 4)
    config = transformer_config(ns)  # Megatron-Core's own checks, then its module names
    if ns.recompute_modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = dataclasses.replace(config, recompute_modules=ns.recompute_modules)
        assert config.recompute_modules == [m.value for m in rc.modules]
    back = import_megatron(path, model=None, cluster=p.cluster.profile, num_gpus=None)
    assert back.recompute == rc


def test_megatron_core_refuses_what_the_plan_refuses(tmp_path: Path):
    """Megatron-Core rejects a module name it does not have, as the plan loader does."""
    _, argv = _megatron_args(tmp_path, _plan(Recompute(policy=SEL)))
    config = transformer_config(megatron_parser().parse_args(argv))
    with pytest.raises((ValueError, AssertionError)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataclasses.replace(config, recompute_modules=["attention"])
    with pytest.raises(ConfigError, match="recompute.modules"):
        plan_from_dict({**plan_to_dict(_plan(Recompute(policy=SEL))),
                        "recompute": {"policy": "selective", "modules": ["attention"]}})


def test_plain_selective_and_full_export_as_before(tmp_path: Path):
    """Plans without the new fields write the flags they wrote before (no --recompute-modules,
    full = uniform groups of one layer)."""
    _, sel = _megatron_args(tmp_path, _plan(Recompute(policy=SEL)))
    _, full = _megatron_args(tmp_path, _plan(Recompute(policy=FULL)))
    assert "--recompute-modules" not in sel and "selective" in sel
    assert full[full.index("--recompute-method") + 1] == "uniform"
    assert full[full.index("--recompute-num-layers") + 1] == "1"


def test_flag_values_reads_a_list_flag_up_to_the_next_flag():
    text = "pretrain_gpt.py --recompute-modules core_attn mlp \\\n --bf16 --x 1"
    assert flag_values(text, "--recompute-modules") == ["core_attn", "mlp"]
    assert flag_values("--recompute-modules=mlp --bf16", "--recompute-modules") == ["mlp"]
    assert flag_values("--bf16", "--recompute-modules") is None


def test_old_plans_load_and_save_identically(tmp_path: Path):
    p = _plan(Recompute(policy=FULL, num_layers=2))
    data = plan_to_dict(p)
    assert data["recompute"] == {"policy": "full", "num_layers": 2}  # no new keys written
    written = save_plan(p, tmp_path / "plan.yaml")
    assert load_plan(written) == p
    new = _plan(MEGATRON_PLANS["uniform-4"])
    assert plan_to_dict(new)["recompute"] == {"policy": "full", "num_layers": 4,
                                              "method": "uniform"}
    assert load_plan(save_plan(new, tmp_path / "new.yaml")) == new


@pytest.mark.parametrize(("fields", "field"), [
    ({"policy": "full", "modules": ["mlp"]}, "recompute.modules"),
    ({"policy": "selective", "modules": []}, "recompute.modules"),
    ({"policy": "selective", "modules": ["mlp", "mlp"]}, "recompute.modules"),
    ({"policy": "selective", "method": "uniform", "num_layers": 2}, "recompute.method"),
    ({"policy": "full", "method": "uniform"}, "recompute.num_layers"),
])
def test_bad_combinations_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=field):
        plan_from_dict({**plan_to_dict(_plan(Recompute())), "recompute": fields})


def _torchtitan(p, fmt: str) -> str:
    files = export_plan(get_target("torchtitan"), p, p.model_spec(),
                        dataclasses.replace(OPTS, torchtitan_format=fmt))
    return next(iter(files.values()))


def test_torchtitan_selective_is_op_level_and_every_nth_block():
    llama = dict(parallel=Parallel(dp=8), batch=Batch(1, 64), zero_stage=3)
    sel = plan("llama-3.1-8b", 8, recompute=Recompute(policy=SEL), **llama)
    toml = _torchtitan(sel, "toml")
    assert 'mode = "selective"' in toml and 'selective_ac_option = "op"' in toml
    assert "SelectiveAC.Config()" in _torchtitan(sel, "python")
    # the first 8 of 32 layers (block method) cost what every 4th block does
    nth = plan("llama-3.1-8b", 8, recompute=Recompute(policy=FULL, num_layers=8), **llama)
    assert 'selective_ac_option = "4"' in _torchtitan(nth, "toml")
    for rc, why in ((Recompute(policy=FULL, num_layers=8), "every block or none"),
                    (Recompute(policy=SEL, modules=(M.MLP,)), "by module")):
        with pytest.raises(ConfigError, match=why):
            _torchtitan(plan("llama-3.1-8b", 8, recompute=rc, **llama), "python")


def test_deepspeed_refuses_groups_and_megatron_deepspeed_writes_them():
    rc = MEGATRON_PLANS["uniform-4"]
    with pytest.raises(ConfigError, match="group size"):
        p = plan(zero_stage=2, recompute=rc)
        export_plan(get_target("deepspeed"), p, p.model_spec(), OPTS)
    p = plan("gpt3-13b", 16, parallel=Parallel(dp=8, tp=2), zero_stage=1, recompute=rc,
             batch=Batch(1, 64))
    files = export_plan(get_target("deepspeed"), p, p.model_spec(), OPTS)
    text = "\n".join(files.values())
    assert "--checkpoint-activations" in text and "--checkpoint-num-layers 4" in text
    with pytest.raises(ConfigError, match="attention core only"):
        q = dataclasses.replace(p, recompute=Recompute(policy=SEL, modules=(M.MLP,)))
        export_plan(get_target("deepspeed"), q, q.model_spec(), OPTS)


def test_megatron_runtimes_refuse_a_layer_count_on_selective_as_its_export_does():
    """One rule set: Megatron's --recompute-num-layers counts layers for full recompute only,
    so every Megatron preset refuses selective with num_layers (and `search --runtime megatron`
    never ranks it) as `export --to megatron` refuses it; autoplan's runtime runs it."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.cost.runtimes import load_runtime

    partial_sel = _plan(Recompute(policy=SEL, num_layers=2))
    for name in ("megatron", "megatron-2022", "nemo", "megatron-deepep", "megatron-allgather"):
        assert not load_runtime(name).partial_selective
        # Megatron-LM's 2022 code computes attention unfused only
        kernel = Attention.EAGER if name == "megatron-2022" else Attention.FLASH
        est = estimate_plan(partial_sel.replace(attention=kernel), runtime=name)
        assert not est.feasible
        assert any("full recompute only" in r for r in est.reasons), est.reasons
        assert estimate_plan(_plan(Recompute(policy=FULL, num_layers=2)).replace(
            attention=kernel), runtime=name).feasible
    assert estimate_plan(partial_sel, runtime="autoplan-cuda").feasible
    with pytest.raises(ConfigError, match="full recompute only"):
        export_plan(get_target("megatron"), partial_sel, partial_sel.model_spec(), OPTS)
