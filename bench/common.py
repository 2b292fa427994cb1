"""Shared bench plumbing: Django and database setup, statistics, SQL instrumentation,
a small table printer and the PASS/MISS summary."""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = uuid.uuid4().hex[:8]  # names this bench invocation's queues and files


# --------------------------------------------------------------------------- setup


def database_url() -> str:
    from bench.settings import DEFAULT_DATABASE_URL

    return os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL


def ensure_database(url: str) -> str:
    """Create the database of `url` if it is missing; return its name."""
    import dj_database_url
    import psycopg
    from psycopg import sql

    cfg = dj_database_url.parse(url)
    name = cfg["NAME"]
    params = {
        "host": cfg.get("HOST") or "127.0.0.1",
        "port": cfg.get("PORT") or 5432,
        "user": cfg.get("USER") or "postgres",
        "dbname": "postgres",
        "autocommit": True,
    }
    if cfg.get("PASSWORD"):
        params["password"] = cfg["PASSWORD"]
    with psycopg.connect(**params) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not found:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def setup_django() -> str:
    """Point Django at bench.settings and the bench database, migrate; return the db name."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    url = database_url()
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12")
    name = ensure_database(url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("bench needs Postgres: set DATABASE_URL=postgres://...")
    call_command("migrate", verbosity=0)
    import example_project.celery  # noqa: F401 - the Celery app the engine enqueues with

    return name


def reset_tables(db_name: str) -> bool:
    """Empty the agentrun tables, but only in a database made for benchmarks."""
    if "bench" not in db_name:
        return False
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE agentrun_runeventrow, agentrun_toolcall, agentrun_turn, agentrun_run CASCADE"
        )
    return True


# --------------------------------------------------------------------------- statistics


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --------------------------------------------------------------------------- SQL instrumentation

_WRITES = ("INSERT", "UPDATE", "DELETE", "MERGE")
_TX_CONTROL = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")


def _is_write(sql: str) -> bool:
    head = sql.lstrip().upper()
    if head.startswith("SELECT * FROM AGENTRUN_WRITE("):  # the engine's write (queries.sql)
        return True
    if head.startswith("WITH"):  # data-modifying CTEs (the engine's combined writes)
        return re.search(r"\(\s*(INSERT|UPDATE|DELETE)\b", head) is not None
    return head.startswith(_WRITES) or " FOR UPDATE" in head or " FOR NO KEY UPDATE" in head


def _signature(sql: str) -> str:
    """A short name of a statement: verb and table (and the RETURNING of the CAS writes)."""
    words = sql.replace('"', "").split()
    upper = [w.upper() for w in words]
    verb = upper[0] if upper else "?"
    if verb == "WITH":  # WITH c0 AS (UPDATE ...), r AS (UPDATE agentrun_run ...), e AS (INSERT ...)
        return "WITH (row updates + UPDATE agentrun_run + INSERT agentrun_runeventrow)"
    key = {"INSERT": "INTO", "UPDATE": "UPDATE"}.get(verb, "FROM")
    table = words[upper.index(key) + 1] if key in upper[:-1] else "?"
    extra = ""
    if verb == "INSERT" and "UNNEST" in " ".join(upper):
        extra = " (bulk)"
    if verb == "SELECT" and " FOR UPDATE" in sql.upper():
        extra = " FOR UPDATE"
    if "RETURNING" in upper:
        extra += " RETURNING"
    return f"{verb} {table}{extra}"


@dataclass
class SQLCounter:
    """Counts statements and COMMITs on one connection.

    COMMITs are counted where Django issues them (the connection's `_commit`, called
    when the outermost atomic block exits) plus every statement run in autocommit
    mode (outside any atomic block: the server commits it on its own). A commit is
    *durable* when its transaction wrote something (INSERT/UPDATE/DELETE or a row
    lock), i.e. it has to flush WAL; read-only commits are counted separately.
    An atomic block that ran no statement sends no COMMIT and is not counted.
    Savepoints are not statements of interest and are counted apart.
    """

    queries: int = 0
    savepoints: int = 0
    commits: int = 0
    durable_commits: int = 0
    rollbacks: int = 0
    autocommits: int = 0  # statements outside any transaction block (no BEGIN/COMMIT sent)
    db_seconds: float = 0.0  # time inside execute() (BEGIN included) and COMMIT
    by_signature: dict[str, list[float]] = field(default_factory=dict)
    _dirty: bool = False  # the open transaction wrote something
    _touched: bool = False  # the open transaction ran a statement (psycopg sent BEGIN)

    def reset(self) -> None:
        self.queries = self.savepoints = self.commits = self.durable_commits = 0
        self.rollbacks = self.autocommits = 0
        self.db_seconds = 0.0
        self.by_signature = {}

    @property
    def round_trips(self) -> int:
        """Statements, savepoints, and BEGIN + COMMIT (or ROLLBACK) of each transaction block
        (psycopg 3 sends BEGIN as a round trip of its own)."""
        blocks = self.commits - self.autocommits + self.rollbacks
        return self.queries + self.savepoints + 2 * blocks

    def snapshot(self) -> tuple[int, int, int]:
        return self.queries, self.commits, self.durable_commits

    def _wrapper(self, conn: Any) -> Callable:
        def wrapper(execute, sql, params, many, context):
            if sql.lstrip().upper().startswith(_TX_CONTROL):
                self.savepoints += 1
                start = time.perf_counter()
                try:
                    return execute(sql, params, many, context)
                finally:
                    self.db_seconds += time.perf_counter() - start
            autocommit = not conn.in_atomic_block and conn.get_autocommit()
            start = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                elapsed = time.perf_counter() - start
                self.db_seconds += elapsed
                self.queries += 1
                self.by_signature.setdefault(_signature(sql), []).append(elapsed)
                if autocommit:
                    self.commits += 1
                    self.autocommits += 1
                    if _is_write(sql):
                        self.durable_commits += 1
                else:
                    self._touched = True
                    self._dirty = self._dirty or _is_write(sql)

        return wrapper

    @contextmanager
    def installed(self, conn: Any) -> Iterator[SQLCounter]:
        conn.ensure_connection()
        original_commit, original_rollback = conn._commit, conn._rollback

        def commit() -> Any:
            # An atomic block that ran no statement sends no COMMIT (no transaction open).
            self.commits += self._touched
            self.durable_commits += self._dirty
            self._dirty = self._touched = False
            start = time.perf_counter()
            try:
                return original_commit()
            finally:
                elapsed = time.perf_counter() - start
                self.db_seconds += elapsed
                self.by_signature.setdefault("COMMIT", []).append(elapsed)

        def rollback() -> Any:
            self.rollbacks += self._touched
            self._dirty = self._touched = False
            return original_rollback()

        conn._commit, conn._rollback = commit, rollback
        try:
            with conn.execute_wrapper(self._wrapper(conn)):
                yield self
        finally:
            del conn._commit, conn._rollback


# --------------------------------------------------------------------------- output


def table(headers: list[str], rows: list[list[Any]], indent: str = "  ") -> str:
    """Columns of numbers right-aligned, columns of text left-aligned."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(r[i], int | float) or r[i] in ("", "-") for r in rows) and i > 0
        for i in range(len(headers))
    ]

    def line(values: list[str]) -> str:
        return (
            indent
            + "  ".join(
                v.rjust(w) if num else v.ljust(w)
                for v, w, num in zip(values, widths, numeric, strict=True)
            ).rstrip()
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 74 - len(title)), flush=True)


@dataclass
class Check:
    section: str
    name: str
    passed: bool | None  # None: not measured (the section failed)
    figure: str

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "N/A"}[self.passed]


CHECKS: list[Check] = []
FIGURES: list[tuple[str, str, str]] = []  # (section, name, value) for the summary


def check(section_name: str, name: str, passed: bool | None, figure: str) -> None:
    CHECKS.append(Check(section_name, name, passed, figure))
    print(f"  [{CHECKS[-1].verdict}] {name}: {figure}", flush=True)


def figure(section_name: str, name: str, value: str) -> None:
    FIGURES.append((section_name, name, value))
