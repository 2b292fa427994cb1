"""The named statements of queries.sql, loaded once.

    sql("claim_released")  # the text, with %(name)s parameters

Each statement is complete: values are named parameters, nothing is spliced in. None
relies on state left on a server connection between transactions (no SQL PREPARE, no
session SET, no session-level advisory lock: a cap's is the transaction's, no temporary
table): each works behind a connection pooler that gives every transaction another server
connection (PgBouncer in transaction mode). The long write is a function a migration
installs (`write_function`), whose plans Postgres keeps per server connection; `write` is
its call.
"""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^-- name: (\w+)\s*$")


def _load(text: str) -> dict[str, str]:
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        found = _NAME.match(line)
        if found:
            current = queries.setdefault(found.group(1), [])
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in queries.items()}


# Through importlib.resources: read from wherever the package was installed (a wheel, a
# zip), not only from a source tree.
QUERIES = _load(files(__package__).joinpath("queries.sql").read_text(encoding="utf-8"))


def sql(name: str) -> str:
    """The statement `name`."""
    return QUERIES[name]
