"""The named statements of queries.sql, loaded once, and how they are sent.

    sql("claim_released")                    # the text, with %(name)s parameters
    execute(cursor, "write", {"run_id": ...})  # sent as a prepared statement

Each statement is complete: values are named parameters, nothing is spliced in. On
Postgres, `execute` prepares a statement once per connection (`PREPARE agentrun_<name>`)
and sends `EXECUTE` after that: the statement is parsed and planned once, not for every
commit (its text is long: one statement serves every write shape). With
AGENTRUN_PREPARED_STATEMENTS = False (PgBouncer in transaction pooling mode without
`max_prepared_statements`), it is sent as it is each time.
"""

from __future__ import annotations

import functools
import re
import sys
import weakref
from importlib.resources import files
from typing import Any

from django.db import DatabaseError, connection

from ..conf import agentrun_settings

_NAME = re.compile(r"^-- name: (\w+)\s*$")
_PARAMETER = re.compile(r"%\((\w+)\)s")


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


@functools.cache
def positional(name: str) -> tuple[str, tuple[str, ...]]:
    """The statement `name` with $1, $2... for its parameters, and their names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _PARAMETER.sub(number, QUERIES[name]), tuple(names)


# The statements prepared on each database connection (the driver's connection object),
# with how many times each was executed since it was prepared.
_prepared: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()

# A prepared statement keeps the plan Postgres made for it until something invalidates it
# (an ANALYZE of its tables, a schema change). A worker's connection can outlive the size
# its tables had then by far (a fresh database, autovacuum off or behind): prepare it again
# after this many executions, so that its plan follows the tables (one planning per
# thousand commits).
REPLAN_EVERY = 1000


def _binds_on_server(cursor: Any) -> bool:
    """psycopg 3 with server-side binding (Django's `server_side_binding` option): psycopg
    prepares a statement itself once it was sent `prepare_threshold` times. Never imports a
    driver the project does not use."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and not isinstance(cursor.cursor, psycopg.ClientCursor)


def execute(cursor: Any, name: str, params: dict[str, Any]) -> None:
    """Send the statement `name` with `params` through `cursor`: prepared on Postgres."""
    if (
        connection.vendor != "postgresql"
        or not agentrun_settings.PREPARED_STATEMENTS
        or _binds_on_server(cursor)
    ):
        cursor.execute(QUERIES[name], params)
        return
    raw = connection.connection
    done = _prepared.setdefault(raw, {})
    text, names = positional(name)
    executed = done.get(name)
    if executed is None:
        cursor.execute(f"PREPARE agentrun_{name} AS {text}")
        executed = 0
    elif executed >= REPLAN_EVERY and not connection.in_atomic_block:
        _prepare_again(cursor, name, text)
        executed = 0
    done[name] = executed + 1
    placeholders = ", ".join(["%s"] * len(names))
    values = [params[n] for n in names]
    try:
        cursor.execute(f"EXECUTE agentrun_{name}({placeholders})", values)
    except DatabaseError as exc:
        # Gone from the session (DISCARD ALL behind a pooler): prepare it again, once, when
        # no transaction of the caller's was aborted by the error.
        if _sqlstate(exc) != _NO_SUCH_STATEMENT or connection.in_atomic_block:
            raise
        cursor.execute(f"PREPARE agentrun_{name} AS {text}")
        cursor.execute(f"EXECUTE agentrun_{name}({placeholders})", values)


_NO_SUCH_STATEMENT = "26000"  # invalid_sql_statement_name


def _prepare_again(cursor: Any, name: str, text: str) -> None:
    """A new plan for `name` (outside any transaction of the caller's, so that an error
    here aborts nothing): a session that lost it (DISCARD ALL) just prepares it."""
    try:
        cursor.execute(f"DEALLOCATE agentrun_{name}")
    except DatabaseError as exc:
        if _sqlstate(exc) != _NO_SUCH_STATEMENT:
            raise
    cursor.execute(f"PREPARE agentrun_{name} AS {text}")


def _sqlstate(exc: Exception) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
