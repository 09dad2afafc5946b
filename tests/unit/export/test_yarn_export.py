"""YaRN RoPE scaling (model.rope_scaling rope_type yarn) in the exports: Megatron-LM's MLA flags
(--rope-type yarn, --rotary-scaling-factor, --mscale, --mscale-all-dim; arguments.py at
000c4ac24f _add_mla_args) parsed by Megatron's own flag table and read back; YaRN Megatron
cannot build refused; torchtitan's deepseek_v3 flavor used for DeepSeek-V3's YaRN only where
it applies it; DeepSpeed's comment names it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.megatron_moe import megatron_mscales
from autoplan.export.registry import get_target
from autoplan.model_spec import DEEPSEEK_V3_ROPE_SCALING, PRESETS, RopeScaling, model_dict
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.yaml_io import to_dict

from .consumers import DATA, megatron_parser, run_script

DSV3 = PRESETS["deepseek-v3"]
OPTS = ExportOptions(gpus_per_node=8)
HF_DEFAULT = RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096)
"""YaRN without mscales: cos/sin times 0.1 ln 40 + 1, the softmax unscaled (HF's default)."""


def _plan(model, gpus: int = 16, zero_stage: int = 1, **par) -> Plan:
    par = par or {"dp": gpus, "ep": gpus}
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus), parallel=Parallel(**par),
                batch=Batch(micro_batch_size=1, global_batch_size=8 * gpus),
                zero_stage=zero_stage)


def _megatron(tmp_path: Path, model) -> Path:
    p = _plan(model)
    path = tmp_path / "megatron_args.sh"
    path.write_text(export_plan(get_target("megatron"), p, p.model_spec(),
                                OPTS)["megatron_args.sh"])
    return path


def _parsed(path: Path):
    [call] = run_script(path, {"torchrun": ""})
    return megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])


def test_megatron_writes_deepseek_v3s_yarn_and_reads_it_back(tmp_path):
    path = _megatron(tmp_path, DSV3)
    ns = _parsed(path)
    assert (ns.rope_type, ns.rotary_scaling_factor, ns.mscale, ns.mscale_all_dim) == (
        "yarn", 40.0, 1.0, 1.0)
    assert not ns.use_rope_scaling  # Llama 3.1's switch stays off
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().rope_scaling == DEEPSEEK_V3_ROPE_SCALING
    assert back.model == "deepseek-v3"  # the preset comes back by name


def test_megatron_mscales_carry_hfs_default_magnitudes(tmp_path):
    """Megatron-Core scales cos/sin by mscale(f, --mscale) / mscale(f, --mscale-all-dim) and the
    softmax by mscale(f, --mscale-all-dim)^2: HF's default (no mscales) is --mscale 1
    --mscale-all-dim 0; an attention_factor is the --mscale that reaches it."""
    assert megatron_mscales(HF_DEFAULT) == (1.0, 0.0)
    assert megatron_mscales(DEEPSEEK_V3_ROPE_SCALING) == (1.0, 1.0)
    odd = RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                      attention_factor=1.5)
    m, a = megatron_mscales(odd)
    assert a == 0.0 and 0.1 * m * __import__("math").log(40) + 1 == pytest.approx(1.5)
    assert megatron_mscales(RopeScaling(rope_type="yarn", factor=40.0,
                                        original_max_position_embeddings=4096,
                                        attention_factor=0.5)) is None  # no mscale > 0 does
    for scaling in (HF_DEFAULT, odd):
        model = DSV3.replace(name="ds-hf", rope_scaling=scaling)
        back = import_megatron(_megatron(tmp_path, model), model=None, cluster="h100-sxm-80gb",
                               num_gpus=None)
        got = back.model_spec().rope_scaling
        assert got.attention_scaling == pytest.approx(scaling.attention_scaling)
        assert got.softmax_gain == pytest.approx(scaling.softmax_gain)


@pytest.mark.parametrize(("model", "said"), [
    (PRESETS["gpt-oss-120b"], "model.rope_scaling yarn without multi-latent attention"),
    (DSV3.replace(rope_scaling=RopeScaling(
        rope_type="yarn", factor=40.0, original_max_position_embeddings=8192)),
     "model.rope_scaling original_max_position_embeddings 8192, beta_fast 32, beta_slow 1, "
     "truncate true: Megatron-Core's MLA fixes YaRN's original_max_position_embeddings 4096"),
    (DSV3.replace(rope_scaling=RopeScaling(
        rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, truncate=False)),
     "truncate false: Megatron-Core's MLA fixes"),
    (DSV3.replace(rope_scaling=RopeScaling()),  # MLA builds its own, unscaled rotary embedding
     "model.rope_scaling: Llama 3.1's scaling (factor 8, low_freq_factor 1, high_freq_factor 4, "
     "original_max_position_embeddings 8192) with multi-latent attention: Megatron-Core's MLA "
     "builds its own rotary embedding and ignores --use-rope-scaling"),
])
def test_megatron_refuses_yarn_it_cannot_build(model, said):
    p = _plan(model, 8, dp=8) if model.mla is None else _plan(model)
    reasons = get_target("megatron").check(p, model, OPTS)
    assert any(said in r for r in reasons), reasons


def test_a_model_that_rotates_otherwise_than_the_launch_is_refused(tmp_path):
    path = _megatron(tmp_path, DSV3.replace(name="ds-plain", rope_scaling=None))
    assert "--rope-type" not in path.read_text()  # MLA's default factor 1 rotates unscaled
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model="deepseek-v3", cluster="h100-sxm-80gb", num_gpus=None)
    assert err.value.field.endswith(" --rotary-scaling-factor")  # the flag YaRN needs
    assert err.value.problem == (
        "the launch rotates with no scaling, --model deepseek-v3 with YaRN scaling (factor 40, "
        "original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, truncate true; "
        "cos/sin x1, softmax x1.874)")


@pytest.mark.parametrize("scaling", [
    RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                mscale_all_dim=0.707),
    RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                mscale=0.5),  # HF ignores an mscale alone
    RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                attention_factor=1.2, mscale=1.0, mscale_all_dim=1.0),
    RopeScaling(rope_type="yarn", factor=1.0, original_max_position_embeddings=4096),
], ids=["all-dim-only", "mscale-alone", "factor-and-mscales", "factor-1"])
def test_a_launch_imports_against_the_model_file_it_was_exported_from(tmp_path, scaling):
    """A file may spell YaRN's mscales otherwise than the importer's normal form (or scale by
    factor 1, no scaling): the launch is compared with it by effect, not refused."""
    model = DSV3.replace(name="ds-x", rope_scaling=scaling)
    path = _megatron(tmp_path, model)
    model_file = tmp_path / "ds-x.yaml"
    model_file.write_text(yaml.safe_dump(model_dict(to_dict(model))))
    back = import_megatron(path, model=str(model_file), cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().rope_scaling == scaling


def test_use_rope_scaling_on_an_mla_launch_is_read_as_megatron_runs_it(tmp_path, caplog):
    """Megatron-Core's MLA builds its own rotary embedding: --use-rope-scaling changes nothing
    (GPTModel scales only without MLA), so the model reads unscaled and the import says so."""
    path = _megatron(tmp_path, DSV3.replace(name="ds-plain", rope_scaling=None))
    path.write_text(path.read_text().replace("  --rotary-base", "  --use-rope-scaling\n"
                                             "  --rotary-base"))
    assert "--use-rope-scaling" in path.read_text()
    with caplog.at_level(logging.WARNING):
        back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().rope_scaling is None
    assert any("--use-rope-scaling ignored" in r.getMessage() for r in caplog.records)


def test_rope_type_rope_with_an_mla_softmax_gain_is_refused_on_import(tmp_path):
    """Megatron-Core's MLA multiplies the softmax scale by _yarn_get_mscale(factor,
    mscale_all_dim)^2 whatever --rope-type says: with rope it rotates unscaled yet scales the
    softmax by 1.874, which no model of autoplan's does; without --mscale-all-dim it is plain."""
    path = _megatron(tmp_path, DSV3)
    text = path.read_text().replace("--rope-type yarn", "--rope-type rope")
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert err.value.field.endswith(" --mscale-all-dim") and "\n" not in str(err.value)
    assert "multiplies the softmax scale by 1.874 while rotating unscaled" in err.value.problem
    assert "drop --mscale-all-dim" in err.value.fix
    path.write_text(text.replace("--mscale-all-dim 1.0", "--mscale-all-dim 0.0"))
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().rope_scaling is None


def test_yarn_flags_are_read_not_said_unread(tmp_path, caplog):
    path = _megatron(tmp_path, DSV3)
    with caplog.at_level(logging.WARNING):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert not [r for r in caplog.records if "--mscale" in r.getMessage()
                or "--rope-type" in r.getMessage()]
    path.write_text(path.read_text().replace("--rotary-scaling-factor 40.0",
                                             "--rotary-scaling-factor 0.5"))
    with pytest.raises(ConfigError, match="--rotary-scaling-factor: got 0.5"):
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)


def _titan(model, fmt: str, **par) -> str:
    p = _plan(model, 64, zero_stage=2, **(par or {"dp": 64, "ep": 64}))
    opts = ExportOptions(gpus_per_node=8, torchtitan_format=fmt)
    return next(iter(export_plan(get_target("torchtitan"), p, p.model_spec(), opts).values()))


def test_torchtitan_deepseek_v3_is_the_flavor_where_it_applies_yarn():
    """0.3.0's 671B flavor always rotates with YaRN; 0.2.2's only past original_seq_len 4096
    (precompute_freqs_cis), so the TOML takes DeepSeek-V3's YaRN at 8192 tokens, not at 4096,
    and a model without it at 4096."""
    assert "model_registry('671B'" in _titan(DSV3, "python")
    toml_model = DSV3.replace(mtp_layers=0)
    with pytest.raises(ConfigError, match=r"model.rope_scaling \(DeepSeek-V3's YaRN\) at seq_len "
                                          "4096: torchtitan <= 0.2.2's deepseek_v3 671B applies "
                                          "its YaRN only past original_seq_len 4096"):
        _titan(toml_model, "toml")
    assert 'flavor = "671B"' in _titan(toml_model.replace(seq_len=8192), "toml")
    assert 'flavor = "671B"' in _titan(toml_model.replace(rope_scaling=None), "toml")


@pytest.mark.parametrize("scaling", [None, HF_DEFAULT], ids=["unscaled", "hf-default"])
def test_torchtitan_refuses_a_deepseek_v3_that_rotates_unlike_the_flavor(scaling):
    model = DSV3.replace(rope_scaling=scaling)
    with pytest.raises(ConfigError, match="torchtitan's deepseek_v3 671B with YaRN scaling "
                                          r"\(factor 40, original_max_position_embeddings 4096, "
                                          "beta_fast 32, beta_slow 1, truncate true; cos/sin "
                                          r"x1, softmax x1.874\); export to megatron"):
        _titan(model, "python")


def test_torchtitan_python_writes_a_dense_yarn_that_only_rotates():
    """ComplexRoPE's scaling="yarn" arguments (0.3.0 models/common/rope.py RoPE.Config) for a
    YaRN that scales neither cos/sin nor the softmax; gpt-oss's 1.347 on cos/sin is refused."""
    base = PRESETS["llama-2-13b"].replace(name="llama-2-13b-yarn")
    rotating = RopeScaling(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096,
                           attention_factor=1.0, truncate=False)
    text = _titan(base.replace(rope_scaling=rotating), "python", dp=64)
    assert ('theta=10000.0, scaling="yarn", rope_factor=4.0, beta_fast=32.0, beta_slow=1.0, '
            "original_seq_len=4096, truncate=False)") in text
    with pytest.raises(ConfigError, match=r"model.rope_scaling: the model rotates with YaRN "
                                          r"scaling \(factor 4, .*; cos/sin x1.139, softmax x1\), "
                                          "torchtitan's Llama 3 by YaRN's frequencies alone"):
        _titan(base.replace(rope_scaling=RopeScaling(
            rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)), "python",
               dp=64)


def test_torchtitan_yarn_keywords_are_complex_ropes_pinned_fields():
    """Every keyword of the ComplexRoPE.Config call the Python config writes for a dense YaRN is
    a field of torchtitan 0.3.0's RoPE.Config (tests/data/export/torchtitan_fields.yaml, read
    from the wheel), checked without torchtitan installed."""
    import ast

    fields = yaml.safe_load((DATA / "torchtitan_fields.yaml").read_text())
    known = set(fields["python_custom_llama3"]["ComplexRoPE"])
    model = PRESETS["llama-2-13b"].replace(name="llama-2-13b-yarn", rope_scaling=RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=4096,
        attention_factor=1.0))
    calls = [node for node in ast.walk(ast.parse(_titan(model, "python", dp=64)))
             if isinstance(node, ast.Call) and ast.unparse(node.func) == "ComplexRoPE.Config"]
    [call] = calls
    written = {kw.arg for kw in call.keywords}
    assert {"scaling", "rope_factor", "beta_fast", "beta_slow", "original_seq_len",
            "truncate"} <= written
    assert written <= known, written - known


def test_torchtitan_yarn_keywords_are_complex_ropes():
    rope = pytest.importorskip("torchtitan.models.common.rope")
    import dataclasses

    names = {f.name for f in dataclasses.fields(rope.ComplexRoPE.Config)}
    assert {"scaling", "rope_factor", "beta_fast", "beta_slow", "original_seq_len",
            "truncate"} <= names


def test_deepspeed_names_yarn_in_its_comment():
    model = PRESETS["llama-2-13b"].replace(name="llama-2-13b-yarn", rope_scaling=HF_DEFAULT)
    p = _plan(model, 16, dp=8, tp=2)
    p = p.replace(sequence_parallel=True)
    launch = export_plan(get_target("deepspeed"), p, model, OPTS)["launch.sh"]
    assert ("with YaRN scaling (factor 40, original_max_position_embeddings 4096, beta_fast 32, "
            "beta_slow 1, truncate true; cos/sin x1.369, softmax x1)") in launch
    assert "applies that scaling." in launch
