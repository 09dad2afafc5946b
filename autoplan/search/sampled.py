"""Which sampler a search runs and, for a sampled one, what it says of itself: the space it
drew from against max_enumerate (user test 38: a fallback to TPE said nowhere that it priced 135
of 7M plans), and what to do when most trials broke a plan rule."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autoplan.search.targets import MISS_KEYS

if TYPE_CHECKING:
    from autoplan.search.engine import SearchRequest
    from autoplan.search.scoring import Scored


@dataclass(frozen=True)
class SampledSpace:
    """The space a sampled search of one GPU type drew its trials from."""

    cluster: str
    candidates: int
    """Candidates an exhaustive search would list (SearchRequest.space_size): of every GPU
    count, or, where the default sampler fell back over a range, of `num_gpus`, its largest."""
    num_gpus: int | None
    """The GPU count whose candidates exceeded max_enumerate (a range only), else None."""
    max_enumerate: int
    fallback: bool
    """True: no --sampler was given and the space exceeds max_enumerate, so TPE (NSGA-II with
    several objectives) sampled it; False: --sampler chose the sampler."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_sampler(req: SearchRequest) -> tuple[str, SampledSpace | None]:
    """The sampler a search of one GPU type runs and, for a sampled one, its SampledSpace: the
    exhaustive search where each GPU count's candidates fit max_enumerate (a range is scored
    count by count), else TPE, or NSGA-II for several objectives; --sampler overrides."""
    limit = req.space.max_enumerate
    if req.sampler is not None:
        name = req.pick_sampler()  # checks the name
        if name == "exhaustive":
            return name, None
        return name, SampledSpace(req.profile_ref, req.space_size(), None, limit, False)
    n, rows = req.largest_count()
    if rows <= limit:
        return "exhaustive", None
    return ("nsga2" if req.targets.multi else "tpe"), SampledSpace(
        req.profile_ref, rows, n if len(req.gpu_counts) > 1 else None, limit, True)


def sampled_text(spaces: list[dict[str, Any]], several_types: bool) -> str:
    """Why and what the search sampled, for the header (SampledSpace.to_dict each): "the
    space's 6,992,568 candidates exceed max_enumerate 5,000,000" where it fell back, "of the
    space's 6,992,568 candidates" where --sampler chose; "at 1024 GPUs" where a range's largest
    count decided, each GPU type named where there are several. Empty where nothing was
    sampled."""
    parts = []
    for s in spaces:
        whose = f"{s['cluster']}'s" if several_types else "the space's"
        at = f" at {s['num_gpus']} GPUs" if s.get("num_gpus") else ""
        limit = f" exceed max_enumerate {s['max_enumerate']:,}" if s["fallback"] else ""
        parts.append(f"{whose} {s['candidates']:,} candidates{at}{limit}")
    if not parts:
        return ""
    return ("" if any(s["fallback"] for s in spaces) else "of ") + "; ".join(parts)


SAMPLER_NAMES = {"tpe": "TPE", "nsga2": "NSGA-II", "random": "random sampling"}


def sampling_note(req: SearchRequest, sampler: str, scored: Scored, trials: int) -> str | None:
    """What to do when most trials of a sampled search broke a plan rule before any estimate:
    the few scored are too few to say nothing fits, so the infeasible outcome says how many
    were scored and how to score more (a range of 121 GPU counts once ended on "no feasible
    plan" with 1 of 300 trials scored). None for the exhaustive search, which scores or counts
    every candidate, where most trials were scored, and where none was: nearest.nearest_miss
    then judges a sample of the space, and says to raise --trials only where that sample holds
    a valid candidate (a rule every candidate breaks is not cured by more trials)."""
    if sampler not in SAMPLER_NAMES:
        return None
    c = scored.counts
    done = c.get("feasible", 0) + sum(c.get(k, 0) for k in MISS_KEYS)
    # a format one GPU type of several lacks (an A100's fp8 rows) is no rule more trials cure
    rejected = sum(v for k, v in c.items()
                   if k not in (*MISS_KEYS, "feasible", "duplicate", "precision-unsupported"))
    if done == 0 or 2 * rejected <= trials:
        return None
    narrow = "narrow --num-gpus" if len(req.gpu_counts) > 1 else "narrow the space"
    return (f"{SAMPLER_NAMES[sampler]} scored {done:,} of {trials:,} trials ({rejected:,} broke "
            f"a plan rule before any estimate), too few to say nothing fits: raise --trials or "
            f"{narrow}")
