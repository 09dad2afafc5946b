"""`export --to slurm` for a real pretraining submit (user test 37, finding 16): the length in
tokens (`--train-tokens`, made into --steps from the plan's global batch x seq_len, rounded up,
said in the header); no `#SBATCH --time` unless `--time-limit` gives one (the priced run is
advice in the header), which is checked against the steps at the band's top, the saves, a
start-up allowance and the time-limit warning's lead (a job priced longer is refused, exit 3,
unless it requeues itself)"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.export.base import export_plan
from autoplan.export.job_length import (
    START_UP_S,
    format_time,
    human_time,
    parse_time_s,
    tokens_text,
)
from autoplan.export.launch import CHECKPOINT_EVERY, SAVE_MARGIN_S, stop_lead
from autoplan.export.registry import get_target
from autoplan.export.slurm import SIGNAL_MAX_S, SlurmOptions
from autoplan.plan import ClusterRef, Plan
from autoplan.plan_files import save_plan
from tests.cli_refusals import assert_refused

from .cases import CASES
from .real_sbatch import ACCEPTED, needs_sbatch, sbatch_test_only

PLAN = CASES["dp-zero1"][0]
"""gpt3-1.3b on 16 H100s: a global batch of 128 sequences of 2048 tokens."""
TIME = re.compile(r"^#SBATCH --time=(\S+)$", re.M)
STEPS = re.compile(r"^  autoplan train .* --steps (\d+) ", re.M)


def _sbatch(plan: Plan = PLAN, **kw) -> str:
    return export_plan(get_target("slurm"), plan, plan.model_spec(),
                       SlurmOptions(gpus_per_node=8, **kw))["autoplan.sbatch"]


def _header(text: str) -> str:
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


def _needed_s(plan: Plan, steps: int, checkpoint_every: int = CHECKPOINT_EVERY) -> float:
    """The job as --time-limit is checked against: every step at the band's upper edge, a save
    every checkpoint_every steps, the start-up allowance, then the --signal lead."""
    lead = stop_lead(plan, plan.model_spec(), 8)
    return (steps * lead.step_s * (1 + lead.band) + math.ceil(steps / checkpoint_every)
            * SAVE_MARGIN_S + START_UP_S + min(SIGNAL_MAX_S, lead.seconds_s))


def _export(tmp_path: Path, *flags: str) -> list[str]:
    plan_file = tmp_path / "plan.yaml"
    if not plan_file.exists():
        save_plan(PLAN, plan_file)
    return ["export", str(plan_file), "--to", "slurm", "--out", str(tmp_path / "job.sbatch"),
            *flags]


def test_train_tokens_become_steps_rounded_up_and_the_header_says_so(tmp_path: Path, capsys):
    per_step = 128 * 2048
    assert PLAN.model_spec().seq_len == 2048 and PLAN.batch.global_batch_size == 128
    assert main(_export(tmp_path, "--train-tokens", "1e9")) == 0, capsys.readouterr().err
    text = (tmp_path / "job.sbatch").read_text()
    steps = math.ceil(1e9 / per_step)  # 3814.7 -> 3815
    assert steps == 3815 and STEPS.findall(text) == [str(steps)]
    assert (f"--train-tokens 1,000,000,000: --steps 3,815, the tokens over {per_step:,} a step (128 "
            f"sequences x 2,048 tokens), rounded up: {steps * per_step:,} tokens in all"
            in _header(text))


def test_train_tokens_take_a_count_suffix(tmp_path: Path, capsys):
    """1T is how people say it (cli_common.amount, as search and estimate take it)."""
    assert main(_export(tmp_path, "--train-tokens", "1B")) == 0, capsys.readouterr().err
    assert STEPS.findall((tmp_path / "job.sbatch").read_text()) == [str(math.ceil(1e9 / 2**18))]


def test_train_tokens_are_refused_beside_steps_and_for_other_targets(tmp_path: Path, capsys):
    assert_refused(capsys, _export(tmp_path, "--train-tokens", "1e9", "--steps", "10"),
                   "--train-tokens: given with --steps 10", "give one of them")
    plan_file = tmp_path / "plan.yaml"
    assert_refused(capsys, ["export", str(plan_file), "--to", "kubernetes", "--train-tokens",
                            "1e9"], "--train-tokens: --to kubernetes writes no train-tokens",
                   "export --to slurm or torchrun")
    assert_refused(capsys, ["export", str(plan_file), "--to", "torchrun", "--time-limit",
                            "60"], "--time-limit: --to torchrun writes no time-limit")
    with pytest.raises(SystemExit) as exit_:
        main(_export(tmp_path, "--train-tokens", "lots"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--train-tokens: got 'lots'; write a number of tokens" in err
    assert not (tmp_path / "job.sbatch").exists()


@pytest.mark.parametrize("steps", [20, 5000])
def test_no_time_is_written_by_default_and_the_header_advises_the_priced_run(steps: int):
    """A --time sized to the steps alone left a 20-step job seconds for srun, the rendezvous,
    NCCL and the model build, then it stopped early and ended COMPLETED: by default the
    partition's limit applies and the priced run is advice."""
    text = _sbatch(steps=steps)
    assert not TIME.findall(text)
    lead = stop_lead(PLAN, PLAN.model_spec(), 8)
    header = _header(text)
    assert "no --time: the partition's limit applies" in header
    assert (f"Priced run: {human_time(steps * lead.step_s)} at the priced step, "
            f"{human_time(steps * lead.step_s * (1 + lead.band))} at the band's top" in header)
    assert "--time-limit D-HH:MM:SS writes #SBATCH --time and checks it" in header
    assert f"{human_time(_needed_s(PLAN, steps))} (" in header


def test_the_check_counts_start_up_and_the_saves():
    """A limit that holds the steps and the warning but not start-up and saves is short."""
    steps, every = 5000, 100
    lead = stop_lead(PLAN, PLAN.model_spec(), 8)
    bare = steps * lead.step_s * (1 + lead.band) + min(SIGNAL_MAX_S, lead.seconds_s)
    needed = _needed_s(PLAN, steps, every)
    assert needed - bare == 50 * SAVE_MARGIN_S + START_UP_S
    assert needed > parse_time_s(format_time(bare))
    with pytest.raises(InfeasiblePlanError, match="short of"):
        _sbatch(steps=steps, checkpoint_every=every, time_limit=format_time(bare))
    enough = format_time(needed)
    assert TIME.findall(_sbatch(steps=steps, checkpoint_every=every,
                                time_limit=enough)) == [enough]


def test_time_limit_none_writes_no_time_and_a_given_one_is_written():
    assert not TIME.findall(_sbatch(time_limit="none"))
    assert TIME.findall(_sbatch(time_limit="7-00:00:00")) == ["7-00:00:00"]
    assert TIME.findall(_sbatch(time_limit="90")) == ["0-01:30:00"]


def test_a_job_priced_past_the_limit_is_refused_unless_it_requeues(tmp_path: Path, capsys):
    steps = 1_000_000
    needed = _needed_s(PLAN, steps)
    limit = "0-12:00:00"
    assert needed > parse_time_s(limit)
    with pytest.raises(InfeasiblePlanError) as err:
        _sbatch(steps=steps, time_limit=limit)
    lead = stop_lead(PLAN, PLAN.model_spec(), 8)
    step_s = lead.step_s * (1 + lead.band)
    room = 12 * 3600 - min(SIGNAL_MAX_S, lead.seconds_s) - START_UP_S
    fits = max(n for n in range(int(room // step_s) + 1)
               if n * step_s + math.ceil(n / CHECKPOINT_EVERY) * SAVE_MARGIN_S <= room)
    message = str(err.value)
    assert f"--time-limit {limit} is" in message and f"export with --steps {fits}" in message
    assert "add --requeue" in message
    text = _sbatch(steps=steps, time_limit=limit, requeue=True)
    assert TIME.findall(text) == [limit]
    assert f"about {fits:,} steps a run" in _header(text)
    # through the CLI: exit 3, one line, nothing written
    code = main(_export(tmp_path, "--steps", str(steps), "--time-limit", limit))
    captured = capsys.readouterr()
    assert code == 3 and len(captured.err.strip().splitlines()) == 1, captured.err
    assert not (tmp_path / "job.sbatch").exists()


def test_a_limit_shorter_than_one_step_and_the_warning_names_the_least(tmp_path: Path):
    with pytest.raises(InfeasiblePlanError, match="not even one step fits"):
        _sbatch(time_limit="1", requeue=True)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("90:30", 5430), ("12:00:00", 43200), ("2-12", 216000),
    ("2-12:30", 217800), ("2-12:30:15", 217815), ("0-00:00:01", 1),
])
def test_slurm_time_forms_are_read_as_sbatch_reads_them(text: str, seconds: int):
    assert parse_time_s(text) == seconds


@pytest.mark.parametrize("text", ["2x", "1:2:3:4", "-5", "0", "1.5", "", "2-", "a-01:00:00"])
def test_a_bad_time_limit_is_one_line_exit_2(tmp_path: Path, capsys, text: str):
    with pytest.raises(ConfigError, match="--time-limit"):
        parse_time_s(text)
    assert_refused(capsys, _export(tmp_path, "--time-limit", text), "--time-limit")


def test_format_time_rounds_up_to_a_minute():
    assert format_time(1) == "0-00:01:00"
    assert format_time(60) == "0-00:01:00"
    assert format_time(86400 + 3601) == "1-01:01:00"


def test_a_plan_not_priced_here_gets_no_time_and_says_why():
    elsewhere = PLAN.replace(cluster=ClusterRef("/nonexistent/site-profile.yaml", 16))
    text = _sbatch(elsewhere)
    assert not TIME.findall(text)
    assert "not priced here" in _header(text)
    assert TIME.findall(_sbatch(elsewhere, time_limit="1-00:00:00")) == ["1-00:00:00"]


def test_a_plan_not_priced_here_is_refused_a_limit_at_or_under_its_lead(tmp_path: Path, capsys):
    """--time-limit 5 under --signal=TERM@600 told the ranks to stop before they started."""
    elsewhere = PLAN.replace(cluster=ClusterRef("/nonexistent/site-profile.yaml", 16))
    lead = min(SIGNAL_MAX_S, stop_lead(elsewhere, elsewhere.model_spec(), 8).seconds_s)
    for limit in ("5", format_time(lead)):
        with pytest.raises(ConfigError, match=f"at or under the {lead} s --signal lead") as err:
            _sbatch(elsewhere, time_limit=limit)
        assert f"at least {format_time(lead + 1)}" in str(err.value)
    assert TIME.findall(_sbatch(elsewhere, time_limit=format_time(lead + 1))) == [
        format_time(lead + 1)]
    plan_file = tmp_path / "elsewhere.yaml"
    save_plan(elsewhere, plan_file)
    assert_refused(capsys, ["export", str(plan_file), "--to", "slurm", "--time-limit", "5",
                            "--gpus-per-node", "8", "--out", str(tmp_path / "job.sbatch")],
                   "--time-limit: got '5'", f"at least {format_time(lead + 1)}")
    assert not (tmp_path / "job.sbatch").exists()


@needs_sbatch
def test_real_sbatch_parses_the_time_written(tmp_path: Path):
    text = _sbatch(steps=1_000_000, time_limit="100-00:00:00")
    assert parse_time_s(TIME.findall(text)[0]) > 86400  # days: the D- form
    assert ACCEPTED in sbatch_test_only(tmp_path, text)  # parsed, then no controller
    bad = TIME.sub("#SBATCH --time=2x", text)
    assert "Invalid --time specification" in sbatch_test_only(tmp_path, bad)


def test_the_time_written_is_echoed_and_over_a_week_warned(tmp_path: Path, capsys, caplog):
    assert main(_export(tmp_path, "--time-limit", "2-00:00:00")) == 0
    err = capsys.readouterr().err
    assert "#SBATCH --time=2-00:00:00 (--time-limit)" in err and "PartitionTimeLimit" not in err
    assert main(_export(tmp_path, "--time-limit", "8-00:00:00", "--force")) == 0
    err = capsys.readouterr().err
    assert "#SBATCH --time=8-00:00:00 (--time-limit)" in err
    assert "over 7 days" in caplog.text and "PartitionTimeLimit" in caplog.text
    assert "--time-limit MAX --requeue" in caplog.text
    assert main(_export(tmp_path, "--force")) == 0  # no --time written: nothing said of it
    assert "#SBATCH --time" not in capsys.readouterr().err


def test_checkpoint_every_0_counts_the_one_save_at_the_end():
    lead = stop_lead(PLAN, PLAN.model_spec(), 8)
    steps = 1000
    needed = (steps * lead.step_s * (1 + lead.band) + SAVE_MARGIN_S + START_UP_S
              + min(SIGNAL_MAX_S, lead.seconds_s))
    assert "1 save x" in _header(_sbatch(steps=steps, checkpoint_every=0, time_limit="30-0"))
    with pytest.raises(InfeasiblePlanError, match="short of"):
        _sbatch(steps=steps, checkpoint_every=0, time_limit=format_time(needed - 120))
    assert TIME.findall(_sbatch(steps=steps, checkpoint_every=0,
                                time_limit=format_time(needed))) == [format_time(needed)]


def test_train_tokens_1t_is_echoed_as_a_number_not_1e12():
    assert tokens_text(1e12) == "1,000,000,000,000" and tokens_text(1.5) == "1.5"


def test_train_tokens_under_half_a_step_warn_of_the_tokens_trained(tmp_path: Path, capsys,
                                                                   caplog):
    """2k tokens came to --steps 1, 262,144 tokens (131x), with no word."""
    assert main(_export(tmp_path, "--train-tokens", "2k")) == 0
    assert STEPS.findall((tmp_path / "job.sbatch").read_text()) == ["1"]
    assert ("--train-tokens 2,000: --steps 1 trains 262,144 tokens, 131x those asked"
            in caplog.text)
    caplog.clear()
    assert main(_export(tmp_path, "--train-tokens", "1B", "--force")) == 0
    assert "those asked" not in caplog.text


def test_one_step_is_said_as_one_step():
    header = _header(_sbatch(steps=1, time_limit="1-0"))
    assert "1 step x" in header and "1 steps" not in header


@pytest.mark.parametrize("text", ["UNLIMITED", "infinite", " none "])
def test_slurms_unlimited_is_read_as_none(tmp_path: Path, capsys, text: str):
    assert main(_export(tmp_path, "--time-limit", text)) == 0
    assert not TIME.findall((tmp_path / "job.sbatch").read_text())


def test_a_refused_time_limit_is_echoed_stripped_and_train_tokens_named(tmp_path: Path, capsys):
    code = main(_export(tmp_path, "--train-tokens", "1T", "--time-limit", " 30 "))
    err = capsys.readouterr().err
    assert code == 3 and "--time-limit 30 is" in err and "' 30 '" not in err
    assert "(instead of --train-tokens)" in err
