"""How long an exported job runs: --train-tokens made into --steps, and SLURM's #SBATCH --time
(--time-limit's, checked against the priced job; none by default) (the stop lead it must leave is launch.stop_lead's; the scripts
that write them are slurm.py and torchrun.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.export.launch import SAVE_MARGIN_S, LaunchOptions, StopLead, comment, plural
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
        raise ConfigError("--train-tokens", f"got {tokens_text(tokens)}: {steps:,} steps of "
                          f"{tokens_per_step(plan, model):,} tokens", f"expected at most "
                          f"{MAX_STEPS * tokens_per_step(plan, model):.3g} tokens")
    return steps


def tokens_text(tokens: float) -> str:
    """A token count as a reader writes it: 1,000,000,000,000 for 1T (not 1e+12)."""
    whole = math.isfinite(tokens) and tokens == int(tokens) and tokens < 1e21
    return f"{int(tokens):,}" if whole else f"{tokens:g}"


def overshoot_warning(run: LaunchOptions, plan: Plan, model: ModelSpec) -> str | None:
    """Where --train-tokens is under half a step's tokens, the steps it came to train over
    twice the tokens asked: a line saying so (None elsewhere)."""
    if run.train_tokens is None:
        return None
    trained = run.steps * tokens_per_step(plan, model)
    if trained <= 2 * run.train_tokens:
        return None
    return (f"--train-tokens {tokens_text(run.train_tokens)}: --steps {run.steps:,} trains "
            f"{trained:,} tokens, {trained / run.train_tokens:,.0f}x those asked (one step "
            f"trains {tokens_per_step(plan, model):,}); give more tokens, or --steps")


MAX_STEPS = 2**40
"""Most steps --train-tokens may come to (as a command-line count, cli_common.MAX_COUNT)."""


def tokens_comment(run: LaunchOptions, plan: Plan, model: ModelSpec) -> list[str]:
    """The header's word on --train-tokens: the steps it came to, and how (none where --steps
    was given as such)."""
    if run.train_tokens is None:
        return []
    per_step = tokens_per_step(plan, model)
    return comment(
        f"--train-tokens {tokens_text(run.train_tokens)}: --steps {run.steps:,}, the tokens over "
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


START_UP_S = 600
"""Seconds a --time-limit must allow beyond the steps for the job's start-up: sbatch's node
prolog, srun, torchrun's c10d rendezvous, NCCL's communicator set-up, building and sharding the
model and loading a checkpoint to resume from. None of it is priced here; on a large job it
runs to minutes (a rendezvous alone waits up to torchrun's 900 s --rdzv-conf join_timeout), so
10 minutes: more than a small job needs, what a big one commonly takes."""

WEEK_S = 7 * 86400
"""Above this a --time is past what most partitions allow (MaxTime is commonly 2 to 7 days)."""


@dataclass(frozen=True)
class TimeLimit:
    """The job's #SBATCH --time and how it was sized: written only where --time-limit gives it,
    then checked against all of --steps at the upper edge of the priced step's error band, the
    periodic saves, a start-up allowance (START_UP_S) and the time-limit warning's lead
    (slurm.StopWarning), which must come after the last step."""

    seconds_s: float | None
    """The --time written (rounded up to a minute there); None: none."""
    needed_s: float | None
    """The time the job needs, as priced (None: not priced here)."""
    why: str
    """How seconds_s came about, for the header."""

    def directive(self) -> list[str]:
        return [] if self.seconds_s is None else [f"#SBATCH --time={format_time(self.seconds_s)}"]

    def comment(self) -> list[str]:
        return comment(self.why)


def saves(steps: int, checkpoint_every: int) -> int:
    """The checkpoint saves a run of `steps` makes: one every `checkpoint_every` steps, the last
    at the end (0: only the one at the end)."""
    return math.ceil(steps / checkpoint_every) if checkpoint_every > 0 else 1


def _steps_fitting(run: LaunchOptions, seconds: float, step_s: float) -> int:
    """Most steps (each at `step_s`, with SAVE_MARGIN_S a save) that fit in `seconds`."""
    every = run.checkpoint_every
    fits = max(0, int(seconds // (step_s + (SAVE_MARGIN_S / every if every > 0 else 0))))
    while fits > 0 and fits * step_s + saves(fits, every) * SAVE_MARGIN_S > seconds:
        fits -= 1
    return fits


def _unpriced_limit(limit: str | None, warning_s: int) -> TimeLimit:
    """--time-limit for a plan not priced here: written as given, once it is past the lead."""
    if limit is None or limit == "none":
        return TimeLimit(None, None, "no --time: the partition's limit applies; the plan is "
                         "not priced here (its profile does not load), so no run time is "
                         "advised; --time-limit D-HH:MM:SS writes #SBATCH --time.")
    given = parse_time_s(limit)
    if given <= warning_s:
        raise ConfigError("--time-limit", f"got {limit.strip()!r} ({human_time(given)}), at or "
                          f"under the {warning_s} s --signal lead, so the ranks would be told to "
                          "stop before they start", f"give more than the lead, at least "
                          f"{format_time(warning_s + 1)} (a step or more beyond it)")
    return TimeLimit(given, None, f"--time={format_time(given)} as given (--time-limit); not "
                     "checked: the plan is not priced here.")


def time_limit(run: LaunchOptions, limit: str | None, lead: StopLead,
               warning_s: int) -> TimeLimit:
    """The --time to write for `limit` (--time-limit: None or "none", none, so the partition's
    limit applies, with the priced run as advice; else a SLURM time, which must hold the job as
    priced unless it requeues itself, then it runs in several turns, each ended by the
    time-limit warning). The job is priced as all of --steps at the upper edge of the step's
    error band (`lead`), a SAVE_MARGIN_S save every --checkpoint-every steps, START_UP_S for the
    start-up, and the warning's `warning_s` seconds, which must come after the last step."""
    if lead.step_s is None:  # not priced here: nothing to size or check the limit by
        return _unpriced_limit(limit, warning_s)
    step_s = lead.step_s * (1 + lead.band)
    n_saves = saves(run.steps, run.checkpoint_every)
    overhead = START_UP_S + n_saves * SAVE_MARGIN_S + warning_s
    needed = run.steps * step_s + overhead
    central = run.steps * lead.step_s
    sized = (f"{run.steps:,} {plural(run.steps, 'step')} x {lead.step_s:.3g} s + {lead.band:.0%} (the upper edge of "
             f"the step {lead.priced_by}), {n_saves:,} {plural(n_saves, 'save')} x "
             f"{SAVE_MARGIN_S} s (--checkpoint-every {run.checkpoint_every:,}), "
             f"{START_UP_S // 60} min for start-up and the {warning_s} s time-limit warning")
    if limit is None or limit == "none":
        return TimeLimit(None, needed, "no --time: the partition's limit applies. Priced run: "
                         f"{human_time(central)} at the priced step, {human_time(run.steps * step_s)}"
                         " at the band's top; --time-limit D-HH:MM:SS writes #SBATCH --time and "
                         f"checks it against {human_time(needed)} ({sized}).")
    given = parse_time_s(limit)
    if given >= needed:
        return TimeLimit(given, needed, f"--time={format_time(given)} as given (--time-limit); "
                         f"the job is priced at {human_time(needed)} ({sized}).")
    short = (f"--time-limit {limit.strip()} is {human_time(needed - given)} short of the "
             f"{human_time(needed)} the job needs ({sized})")
    fits = _steps_fitting(run, given - START_UP_S - warning_s, step_s)
    if fits < 1:
        least = step_s + SAVE_MARGIN_S + START_UP_S + warning_s
        raise InfeasiblePlanError(f"{short}: not even one step fits before the warning; give "
                                  f"at least {format_time(least)} (start-up, one step, a save "
                                  "and the warning)")
    turns = math.ceil(run.steps / fits)
    if not run.requeue:
        given_as = " (instead of --train-tokens)" if run.train_tokens is not None else ""
        raise InfeasiblePlanError(
            f"{short}: {fits:,} {plural(fits, 'step')} {'fits' if fits == 1 else 'fit'} in it; "
            f"export with --steps {fits}{given_as}, add --requeue to train all {run.steps:,} in about {turns} runs that "
            "requeue themselves, or give a longer --time-limit")
    return TimeLimit(given, needed, f"--time={format_time(given)} as given (--time-limit), "
                     f"{human_time(needed - given)} short of the job as priced ({sized}): about "
                     f"{fits:,} {plural(fits, 'step')} a run, so the job requeues itself about "
                     f"{turns - 1} {plural(turns - 1, 'time')} (--requeue).")


def written_time(files: dict[str, str]) -> tuple[str | None, str | None]:
    """For stderr beside "wrote ...": the #SBATCH --time line an export wrote, and above WEEK_S
    a warning that the partition may never run it (None, None where no --time was written)."""
    found = [t for text in files.values() for t in re.findall(r"^#SBATCH --time=(\S+)$", text,
                                                              re.M)]
    if not found:
        return None, None
    line = f"#SBATCH --time={found[0]} (--time-limit)"
    if parse_time_s(found[0]) <= WEEK_S:
        return line, None
    return line, (f"--time={found[0]} is over 7 days: most partitions cap MaxTime at 2-7 days, "
                  "and a longer job may pend with reason PartitionTimeLimit (`scontrol show "
                  "partition` lists MaxTime); export with --time-limit MAX --requeue to run it "
                  "in turns")
