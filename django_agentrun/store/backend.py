"""The store's one interface (`Store`) and its two implementations, chosen once per
database alias (`chosen`): postgres.py (queries.sql's named statements, the database's
clock, a write as one statement) and portable.py (the same through the ORM: SQLite).
Nothing outside them asks which database it is on; the rest of the store (leases.py,
clock.py, locks.py) and `send` below go through the chosen one.

Like procrastinate's connectors (one `App` in front of a psycopg connector or an in-memory
one) and DBOS's system database: one set of operations, one implementation per backend.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.db import connection, connections

from ..models import Run
from .portable import PortableStore
from .postgres import PostgresStore
from .rows import Result
from .writes import Lease, Share, Write


class Store(Protocol):
    """What the engine, the services and the reaper ask of a database (the operations of
    queries.sql), on the connection of the alias it was chosen for."""

    vendor: str

    def claim(
        self,
        run_id: Any,
        owner: str,
        name: str,
        dead_holder: str | None,
        history: bool,
        seconds: float,
    ) -> list[Result]:
        """queries.sql's `name` (claim_released, claim_takeover): the run's row if it was
        claimed (else no row), then (`history`) its turns and tool calls, in order."""
        ...

    def earlier(self, conversation_id: Any, position: int) -> list[Result]:
        """The runs of a conversation before `position` (not rolled back), their turns and
        tool calls, in order."""
        ...

    def take_lease(self, run: Run, owner: str, seconds: float) -> tuple[int, datetime]:
        """Fence out any holder of a locked run's lease: (its new epoch, its expiry)."""
        ...

    def release_lease(self, lease: Lease) -> bool: ...

    def expire_lease(self, lease: Lease) -> bool: ...

    def renew_lease(self, lease: Lease) -> tuple[bool, bool]:
        """(still held, cancel requested)."""
        ...

    def poll_cancel(self, run_id: Any) -> tuple | None:
        """(lease epoch, lease owner, cancel_requested_at) of the run, or None."""
        ...

    def now(self) -> datetime:
        """The time leases are judged by."""
        ...

    def over_cap(self, run_id: Any, shares: list[Share]) -> Share | None:
        """The first of `shares` (column, value, cap) under which `cap` runs other than
        `run_id` are worked now (a live lease), or None. Where the database can, each
        share's lock is taken first and held to the end of the caller's transaction, so
        that claims under one cap count one after the other."""
        ...

    def lock_batch(self, queryset: Any, batch: int) -> list[Any]:
        """Up to `batch` rows of `queryset`, locked, skipping rows others hold (where the
        database can)."""
        ...

    def send(self, write: Write, *, savepoint: bool = False) -> None:
        """Send `write` all or nothing (refused: LeaseLost or ConcurrentUpdate); the run
        instance takes what was written (writes.settle). `savepoint`: inside a caller's
        transaction that must stay usable after a refusal (an atomic tool's), in a
        savepoint of its own."""
        ...


_CHOSEN: dict[str, Store] = {}


def chosen(alias: str | None = None) -> Store:
    """The store of the database `alias` (the default connection's), chosen on first use."""
    alias = alias or connection.alias
    store = _CHOSEN.get(alias)
    if store is None:
        vendor = connections[alias].vendor
        store = PostgresStore() if vendor == "postgresql" else PortableStore(vendor)
        _CHOSEN[alias] = store
    return store


def replace(store: Store | None, alias: str | None = None) -> Store | None:
    """Put `store` in place of the one chosen for `alias` (None: choose again at the next
    use); the one it replaces. For a harness that wraps the chosen store (the schedule
    explorer of the project's tests puts a scheduling point before each operation)."""
    alias = alias or connection.alias
    previous = _CHOSEN.pop(alias, None)
    if store is not None:
        _CHOSEN[alias] = store
    return previous


def send(write: Write) -> Write:
    """Send `write` through the store of the default connection (one statement on Postgres:
    alone in autocommit it is its own transaction, all or nothing; inside a caller's
    transaction it is one more statement of it). Its callbacks and its nudge to the run's
    stream readers run after the commit (writes.sent), at once when it was its own
    transaction, else when the caller's commits. A refused write changes nothing and raises
    LeaseLost or ConcurrentUpdate (writes.refused). The engine holds its store (`Step.store`)
    and sends through it directly."""
    (_CHOSEN.get(connection.alias) or chosen()).send(write)
    return write
