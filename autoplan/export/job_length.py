"""How long an exported job runs: --train-tokens made into --steps, and SLURM's #SBATCH --time
sized from the priced step (the stop lead it must leave is launch.stop_lead's; the scripts
that write them are slurm.py and torchrun.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.export.launch import LaunchOptions, StopLead, comment
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


def tokens_per_step(plan: Plan, model: ModelSpec) -> int:
    """Tokens one optimizer step trains: the global batch (sequences) x the sequence length."""
    return plan.batch.global_batch_size * model.seq_len


def steps_for_tokens(plan: Plan, model: ModelSpec, tokens: float) -> int:
    """The --steps that train at least `tokens` tokens (rounded up to a whole step)."""
    if not (math.isfinite(tokens) and tokens > 0):
        raise ConfigError("--train-tokens", f"got {tokens:g}", "expected a positive number of "
                          "tokens, e.g. 1e12")
    steps = math.ceil(tokens / tokens_per_step(plan, model))
    if steps > MAX_STEPS:
        raise ConfigError("--train-tokens", f"got {tokens:g}: {steps:,} steps of "
                          f"{tokens_per_step(plan, model):,} tokens", f"expected at most "
                          f"{MAX_STEPS * tokens_per_step(plan, model):.3g} tokens")
    return steps


MAX_STEPS = 2**40
"""Most steps --train-tokens may come to (as a command-line count, cli_common.MAX_COUNT)."""


def tokens_comment(run: LaunchOptions, plan: Plan, model: ModelSpec) -> list[str]:
    """The header's word on --train-tokens: the steps it came to, and how (none where --steps
    was given as such)."""
    if run.train_tokens is None:
        return []
    per_step = tokens_per_step(plan, model)
    return comment(
        f"--train-tokens {run.train_tokens:g}: --steps {run.steps:,}, the tokens over "
        f"{per_step:,} a step ({plan.batch.global_batch_size:,} sequences x {model.seq_len:,} "
        f"tokens), rounded up: {run.steps * per_step:,} tokens in all.")


def parse_time_s(text: str, flag: str = "--time-limit") -> int:
    """Seconds of a SLURM time (sbatch(1) --time: "minutes", "minutes:seconds",
    "hours:minutes:seconds", "days-hours", "days-hours:minutes", "days-hours:minutes:seconds")."""
    days, _, rest = text.strip().rpartition("-") if "-" in text else ("0", "", text.strip())
    parts = rest.split(":")
    words = [days, *parts]
    if not all(w.isascii() and w.isdigit() and len(w) <= 6 for w in words) or len(parts) > 3:
        raise ConfigError(flag, f"got {text[:40]!r}", "write a SLURM time: minutes, HH:MM:SS "
                          "or D-HH:MM:SS (e.g. 2-00:00:00), or none to write no --time")
    d, nums = int(days), [int(p) for p in parts]
    if "-" in text:  # days-hours[:minutes[:seconds]]
        h, m, sec = (nums + [0, 0])[:3]
    else:  # minutes | minutes:seconds | hours:minutes:seconds
        h, m, sec = {1: (0, nums[0], 0), 2: (0, *nums), 3: tuple(nums)}[len(nums)]
    seconds = ((d * 24 + h) * 60 + m) * 60 + sec
    if seconds <= 0:
        raise ConfigError(flag, f"got {text[:40]!r}", "give a time above zero, or none to "
                          "write no --time (sbatch reads 0 as no limit)")
    return seconds


def format_time(seconds: float) -> str:
    """`seconds` as sbatch's days-hours:minutes:seconds, rounded up to a whole minute."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def human_time(seconds: float) -> str:
    """`seconds` for a reader: minutes below two hours, hours below two days, else days."""
    if seconds < 2 * 3600:
        return f"{math.ceil(seconds / 60)} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


@dataclass(frozen=True)
class TimeLimit:
    """The job's #SBATCH --time and how it was sized: all of --steps at the upper edge of the
    priced step's error band, plus the time-limit warning's lead (slurm.StopWarning), which must
    come after the last step."""

    seconds_s: float | None
    """The --time written (rounded up to a minute there); None: none."""
    needed_s: float | None
    """The run as priced (None: not priced here)."""
    why: str
    """How seconds_s came about, for the header."""

    def directive(self) -> list[str]:
        return [] if self.seconds_s is None else [f"#SBATCH --time={format_time(self.seconds_s)}"]

    def comment(self) -> list[str]:
        return comment(self.why)


def time_limit(run: LaunchOptions, limit: str | None, lead: StopLead,
               warning_s: int) -> TimeLimit:
    """The --time to write for `limit` (--time-limit: None, the priced run; "none"; else a SLURM
    time, which must hold the priced run unless the job requeues itself, then it runs in several
    turns, each ended by the time-limit warning). The run is priced as all of --steps at the
    upper edge of the step's error band (`lead`), plus the warning's `warning_s` seconds, which
    must come after the last step."""
    if lead.step_s is None:  # not priced here: nothing to size or check the limit by
        if limit == "none":
            return TimeLimit(None, None, "no --time (--time-limit none): the partition's "
                             "default limit applies.")
        if limit is None:
            return TimeLimit(None, None, "no --time: the plan is not priced here (its profile "
                             "does not load), so give --time-limit D-HH:MM:SS; the partition's "
                             "default limit applies meanwhile.")
        given = parse_time_s(limit)
        return TimeLimit(given, None, f"--time={format_time(given)} as given (--time-limit); "
                         "not checked: the plan is not priced here.")
    step_s = lead.step_s * (1 + lead.band)
    needed = run.steps * step_s + warning_s
    sized = (f"{run.steps:,} steps x {lead.step_s:.3g} s + {lead.band:.0%} (the upper edge of "
             f"the step {lead.priced_by}) + the {warning_s} s time-limit warning")
    unpriced = ("start-up, checkpoint loading and the periodic saves (every "
                f"{run.checkpoint_every} steps) are not priced: allow for them")
    if limit == "none":
        return TimeLimit(None, needed, "no --time (--time-limit none): the partition's default "
                         f"limit applies; the run is priced at {human_time(needed)} ({sized}).")
    if limit is None:
        central = run.steps * lead.step_s + warning_s
        return TimeLimit(math.ceil(needed), needed, f"--time={format_time(needed)}: {sized}, "
                         f"rounded up to a minute (at the priced step itself the run takes "
                         f"{human_time(central)}); {unpriced}. --time-limit D-HH:MM:SS sets "
                         "it (a partition allowing less: --time-limit ITS_MAX --requeue runs "
                         "the job in turns), none leaves it to the partition.")
    given = parse_time_s(limit)
    if given >= needed:
        return TimeLimit(given, needed, f"--time={format_time(given)} as given (--time-limit); "
                         f"the run is priced at {human_time(needed)} ({sized}); {unpriced}.")
    short = (f"--time-limit {limit} is {human_time(needed - given)} short of the "
             f"{human_time(needed)} the job needs ({sized})")
    fits = int((given - warning_s) // step_s)
    if fits < 1:
        raise InfeasiblePlanError(f"{short}: not even one step fits before the warning; give "
                                  f"at least {format_time(step_s + warning_s)} (one step and "
                                  "the warning)")
    turns = math.ceil(run.steps / fits)
    if not run.requeue:
        raise InfeasiblePlanError(
            f"{short}: {fits:,} steps fit in it; export with --steps {fits}, add --requeue to "
            f"train all {run.steps:,} in about {turns} runs that requeue themselves, or give a "
            "longer --time-limit")
    return TimeLimit(given, needed, f"--time={format_time(given)} as given (--time-limit), "
                     f"{human_time(needed - given)} short of the priced run ({sized}): about "
                     f"{fits:,} steps a run, so the job requeues itself about {turns - 1} "
                     "times (--requeue).")
