"""The README's search-space reference (user test 36, finding 4) holds every field the loader
(autoplan/search_space.py) reads and no other, so the text cannot drift from the code: each
field is a table row whose first cell is the field in backticks (`parallel.dp`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from autoplan.search_space import SearchSpace

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Search spaces"


def space_keys() -> list[str]:
    """Every key a space file may hold, dotted below its section (`recompute.method`)."""
    keys = ["schema_version"]
    for f in dataclasses.fields(SearchSpace):
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(f.default_factory)]
        else:
            keys.append(f.name)
    return keys


def table_keys(text: str) -> list[str]:
    """The fields a reference documents: the first cell of each table row."""
    return re.findall(r"^\| `([a-z_.]+)` \|", text, flags=re.M)


def drift(text: str) -> tuple[list[str], list[str]]:
    """(fields the loader reads that `text` leaves out, fields it documents that are none)."""
    documented = table_keys(text)
    keys = space_keys()
    return [k for k in keys if k not in documented], [k for k in documented if k not in keys]


def readme_section() -> str | None:
    text = README.read_text(encoding="utf-8")
    if SECTION not in text:
        return None
    body = text.split(SECTION, 1)[1]
    return re.split(r"^#{1,3} ", body, maxsplit=1, flags=re.M)[0]


def test_the_check_names_a_field_left_out_and_one_that_is_none() -> None:
    full = "\n".join(f"| `{k}` | meaning | values | default |" for k in space_keys())
    assert "parallel.dp_shard" in space_keys() and "max_enumerate" in space_keys()
    assert drift(full) == ([], [])
    assert drift(full.replace("| `parallel.etp` |", "| `parallel.etpp` |")) == (
        ["parallel.etp"], ["parallel.etpp"])


def test_the_readme_documents_every_space_field() -> None:
    section = readme_section()
    assert section is not None, f"README.md has no {SECTION!r} section"
    assert drift(section) == ([], [])
