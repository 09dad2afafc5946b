"""The plan's pipeline section from Megatron-LM's pipeline flags: a
--pipeline-model-parallel-layout, virtual stages, or uneven first and last ranks."""

from __future__ import annotations

import re
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.shell_args import Flags
from autoplan.yaml_io import show

MAX_LAYOUT_ITEMS = 2**16
"""Most items a --pipeline-model-parallel-layout may expand to (checked before expanding)."""


def _expanded_length(text: str, pattern: str) -> int:
    """Length of `text` once every `pattern` match (group 1 times group 2) is expanded."""
    total = len(text)
    for m in re.finditer(pattern, text):
        times = int(m.group(2)) if len(m.group(2)) <= 12 else MAX_LAYOUT_ITEMS + 1
        total += len(m.group(1)) * times - len(m.group(0))
    return total


def _expand(text: str, pattern: str, layout: str, what: str) -> str:
    if _expanded_length(text, pattern) > MAX_LAYOUT_ITEMS:
        raise ConfigError(what, f"layout {show(layout, 80)} expands past {MAX_LAYOUT_ITEMS} items",
                          "give one item per layer, e.g. Et*4|t*4L")
    return re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout(layout: str, what: str) -> tuple[int, ...]:
    """Transformer layers per stage of a --pipeline-model-parallel-layout ('Et*3|t*4|tmL'); m
    (multi-token-prediction) items are --mtp-num-layers' modules, not stage layers."""
    text = re.sub(r"[\s,\\]", "", layout)
    while "(" in text:  # (group)*n -> group repeated n times
        new = _expand(text, r"\(([^()]*)\)\*(\d+)", layout, what)
        if new == text:
            raise ConfigError(what, f"cannot read layout {show(layout, 80)}",
                              "expected e.g. Et*4|t*4L")
        text = new
    stages = []
    for chunk in text.split("|"):
        expanded = _expand(chunk, r"([EtLm])\*(\d+)", layout, what)
        if set(expanded) - set("EtLm"):
            raise ConfigError(
                what,
                f"layout {show(layout, 80)} has items autoplan does not model",
                "only E, t, m and L",
            )
        stages.append(expanded.count("t"))
    return tuple(stages)


def pipeline_section(f: Flags, layers: int, pp: int) -> dict[str, Any]:
    """The pipeline section: vpp, schedule and an uneven split when the flags give one."""
    split: tuple[int, ...] | None = None
    vpp = 1
    layout = f.text("--pipeline-model-parallel-layout")
    if layout is not None:
        split = parse_layout(layout, f"{f.what} --pipeline-model-parallel-layout")
        vpp = len(split) // pp if len(split) % pp == 0 else 0
        if vpp == 0:
            raise ConfigError(
                f.what,
                f"the layout has {len(split)} stages, not a multiple of pp={pp}",
                "check --pipeline-model-parallel-layout",
            )
    elif f.integer("--num-layers-per-virtual-pipeline-stage") is not None:
        if _ends(f) != (None, None):  # Megatron's validate_args asserts the same
            raise ConfigError(f"{f.what} --num-layers-per-virtual-pipeline-stage",
                              "given with --decoder-first/last-pipeline-num-layers",
                              "give the virtual stages as --num-virtual-stages-per-pipeline-rank")
        per = f.integer("--num-layers-per-virtual-pipeline-stage") or 1
        vpp = layers // (pp * per) if layers % (pp * per) == 0 else 0
        if vpp == 0:
            raise ConfigError(
                f.what,
                f"{layers} layers do not split into pp={pp} ranks of {per}-layer virtual stages",
                "check the virtual pipeline flags",
            )
    else:
        vpp = f.integer("--num-virtual-stages-per-pipeline-rank", 1) or 1
        if pp > 1 and _ends(f) != (None, None):
            split = _first_last_split(f, layers, pp, vpp)
    out: dict[str, Any] = {"schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "vpp": vpp}
    if split is not None:
        out["layers_per_stage"] = list(split)
    return out


def _ends(f: Flags) -> tuple[int | None, int | None]:
    """--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers."""
    return (f.integer("--decoder-first-pipeline-num-layers"),
            f.integer("--decoder-last-pipeline-num-layers"))


def _first_last_split(f: Flags, layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Layers per stage, in model order, as Megatron-Core builds them from uneven first and
    last ranks (transformer_block.py get_num_layers_to_build): the first (last) rank holds its
    given count, the ranks between share the rest evenly, and each rank's count is split
    evenly over its vpp virtual stages; model stage v * pp + r is rank r's chunk v."""
    first, last = _ends(f)
    flags = "--decoder-first/last-pipeline-num-layers"
    given = (f"first {'unset' if first is None else first}, last "
             f"{'unset' if last is None else last} of {layers} layers on pp={pp}, vpp={vpp}")
    rest = layers - (first or 0) - (last or 0)
    ranks_between = pp - (first is not None) - (last is not None)
    if min(first or 0, last or 0, rest) < 0 or (ranks_between == 0 and rest != 0) \
            or (ranks_between > 0 and rest % ranks_between):
        raise ConfigError(f"{f.what} {flags}", f"got {given}",
                          "the layers the ends leave must split evenly over the ranks between")
    ranks = [rest // ranks_between if ranks_between else 0] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    if any(n % vpp for n in ranks):  # Megatron-Core asserts it too
        raise ConfigError(f"{f.what} {flags}", f"got {given}: ranks of {ranks} layers",
                          f"give each rank a multiple of vpp={vpp} layers")
    return tuple(n // vpp for _ in range(vpp) for n in ranks)
