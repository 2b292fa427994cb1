"""The named statements of queries.sql, loaded once.

    sql("claim_released", expires=..., run_columns=...)

A statement's `{slots}` take identifiers, column lists and placeholder lists built from
the models, never values (those are always %s parameters).
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^-- name: (\w+)\s*$")


def _load(path: Path) -> dict[str, str]:
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        found = _NAME.match(line)
        if found:
            current = queries.setdefault(found.group(1), [])
        elif current is not None and not line.startswith("--"):
            current.append(line)
    # A fragment keeps its leading space (" AND ..."): only line ends are trimmed.
    return {name: "\n".join(lines).strip("\n").rstrip() for name, lines in queries.items()}


QUERIES = _load(Path(__file__).with_name("queries.sql"))


def sql(name: str, **slots: object) -> str:
    """The statement `name`, its slots filled."""
    text = QUERIES[name]
    return text.format(**slots) if slots else text
