"""The store on Postgres: the named statements of queries.sql, leases set and judged by the
database's clock, and a write sent as one statement (the call of the PL/pgSQL function
`agentrun_write`, queries.sql's `write_function`, which migration 0010 installs).

A write's variable parts (rows added or changed, events) travel as JSON parameters
(`dumps`, `row_values`, `changes_values`): one statement text serves every write shape.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from ..conf import agentrun_settings
from ..fields import StorableJSONEncoder
from ..models import Run, ToolCall, Turn
from ..models.recorded import RecordedField
from . import outbox
from .rows import Result, column_names
from .sql import QUERIES
from .writes import Change, Lease, Placed, Share, Write, placed_in, refused, sent, settle

# A lone write that is refused fails on this constraint (unique run + seq of the events'
# row; the run's first row already starts at seq 1): see `write` in queries.sql. A test checks the schema
# still has it.
FENCE_CONSTRAINT = "agentrun_runevent_seq"

COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "cost_usd",
    "turn_count",
)


class PostgresStore:
    """The store (backend.Store) on Postgres. Statement texts are read from QUERIES by
    name (queries.sql)."""

    vendor = "postgresql"

    # -- leases ---------------------------------------------------------------------------

    def claim(
        self,
        run_id: Any,
        owner: str,
        name: str,
        dead_holder: str | None,
        history: bool,
        seconds: float,
    ) -> list[Result]:
        params = {
            "run_id": run_id,
            "owner": owner,
            "lease_seconds": float(seconds),
            "dead_holder": dead_holder,
        }
        statements = [QUERIES[name]]
        if history:
            statements += [QUERIES["select_turns"], QUERIES["select_tool_calls"]]
        return _execute_many(statements, params)

    def earlier(self, conversation_id: Any, position: int) -> list[Result]:
        names = ("select_earlier_runs", "select_earlier_turns", "select_earlier_tool_calls")
        params = {"conversation_id": conversation_id, "position": position}
        return _execute_many([QUERIES[name] for name in names], params)

    def take_lease(self, run: Run, owner: str, seconds: float) -> tuple[int, datetime]:
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["take_lease"],
                {"owner": owner, "lease_seconds": float(seconds), "run_id": run.pk},
            )
            epoch, expires_at = cursor.fetchone()
        return epoch, expires_at

    def release_lease(self, lease: Lease) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["release_lease"], _lease_params(lease))
            return cursor.rowcount == 1

    def expire_lease(self, lease: Lease) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["expire_lease"], _lease_params(lease))
            return cursor.rowcount == 1

    def renew_lease(self, lease: Lease) -> tuple[bool, bool]:
        params = {**_lease_params(lease), "lease_seconds": float(agentrun_settings.LEASE_SECONDS)}
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["renew_lease"], params)
            row = cursor.fetchone()
        if row is None:
            return False, False
        return True, row[0] is not None

    def poll_cancel(self, run_id: Any) -> tuple | None:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["poll_cancel"], {"run_id": run_id})
            return cursor.fetchone()

    # -- time and locks -------------------------------------------------------------------

    def now(self) -> datetime:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["database_now"])
            value = cursor.fetchone()[0]
        return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)

    def over_cap(self, run_id: Any, shares: list[Share]) -> Share | None:
        with connection.cursor() as cursor:
            for column, value, _cap in sorted(shares):  # one lock order
                cursor.execute(QUERIES["lock_share"], {"share": f"agentrun:{column}:{value}"})
            for share in shares:
                column, value, cap = share
                cursor.execute(QUERIES[f"worked_by_{column}"], {"value": value, "run_id": run_id})
                if cursor.fetchone()[0] >= cap:
                    return share
        return None

    def lock_batch(self, queryset: Any, batch: int) -> list[Any]:
        # The rows first (store/locks.py), skipping those a worker or a person holds.
        return list(queryset.select_for_update(skip_locked=True, no_key=True)[:batch])

    # -- a write: one statement -----------------------------------------------------------

    def send(self, write: Write, *, savepoint: bool = False) -> None:
        deliveries = None
        for kind, _ in write.events:  # inline: a write reporting nothing calls nothing more
            if kind in outbox.EVENTS:
                deliveries = outbox.wanted(write)
                break
        if deliveries or savepoint:
            # The outbox's rows join the write's transaction (a savepoint inside a caller's).
            # A refusal leaves it before it is told apart (the statement's failure aborted it),
            # so that the caller's transaction stays usable (an atomic tool's: savepoint).
            try:
                with transaction.atomic():
                    _send(write, fenced=_FencedOut)
                    if deliveries:
                        outbox.insert(write, deliveries)
            except _FencedOut:
                refused(write)
        elif connection.in_atomic_block or write.events:
            _send(write)
        else:
            # Without an event a refusal cannot fail the statement as a whole: give it a
            # transaction of its own, which the refusal's exception rolls back.
            with transaction.atomic():
                _send(write)
        sent(write)


class _FencedOut(Exception):
    """A refused write inside the transaction `send` opened for the outbox."""


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.run_id, "epoch": lease.epoch, "owner": lease.owner}


def _execute_many(statements: list[str], params: dict[str, Any]) -> list[Result]:
    """Statements that return rows; one round trip where the driver allows several
    statements in one query."""
    with connection.cursor() as cursor:
        if len(statements) > 1 and _multi_statement(cursor):
            cursor.execute(";\n".join(statements), params)
            results = [(column_names(cursor), cursor.fetchall())]
            for _ in statements[1:]:
                cursor.nextset()
                results.append((column_names(cursor), cursor.fetchall()))
            return results
        results = []
        for text in statements:
            cursor.execute(text, params)
            results.append((column_names(cursor), cursor.fetchall()))
        return results


def _multi_statement(cursor: Any) -> bool:
    """Several statements with their results in one query: psycopg 3's client-side binding
    cursor only (psycopg2 returns the last statement's rows only; psycopg 3's server-side
    binding refuses several statements). Never imports a driver the project does not use."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(cursor.cursor, psycopg.ClientCursor)


def _send(write: Write, fenced: type[Exception] | None = None) -> None:
    run = write.run
    now = timezone.now()
    turns_added = [o for o in write.added if isinstance(o, Turn)]
    calls_added = [o for o in write.added if isinstance(o, ToolCall)]
    turns_changed = [c for c in write.changed if isinstance(c.obj, Turn)]
    calls_changed = [c for c in write.changed if isinstance(c.obj, ToolCall)]
    for obj in write.added:
        if getattr(obj, "created_at", True) is None:
            obj.created_at = now
    # Values the events hold go as their events' places (1 for the first): the function
    # stores the seqs those take (queries.sql write_function).
    placed = {id(p.obj): p for p in placed_in(write)}
    params = {
        "run_id": run.pk,
        "expected_state": write.expected_state,
        "epoch": write.lease.epoch if write.lease else None,
        "owner": write.lease.owner if write.lease else None,
        "lease": write.lease_change,
        "lease_seconds": float(agentrun_settings.LEASE_SECONDS),
        "run_changes": dumps(changes_values(Run, write.run_fields)),
        **{name: write.counters.get(name, 0) for name in COUNTERS},
        "turns_added": dumps([_placed(row_values(t), placed.get(id(t))) for t in turns_added]),
        "turns_changed": dumps(_changes(Turn, turns_changed, placed)),
        "turns_changed_count": len(turns_changed),
        "calls_added": dumps([row_values(c) for c in calls_added]),
        "calls_changed": dumps(_changes(ToolCall, calls_changed, placed)),
        "calls_changed_count": len(calls_changed),
        "events": dumps([[kind, data] for kind, data in write.events]),
        "event_count": len(write.events),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["write"], params)
            row = cursor.fetchone()
    except IntegrityError as exc:
        if not _fenced_out(exc):
            raise
        if fenced is not None:
            raise fenced() from exc
        row = None
    if row is None:
        refused(write)
    last_seq, cancel_requested_at, _expires, turn_ids, call_ids = row
    turn_id = {index: pk for index, pk in _json(turn_ids)}
    for turn in turns_added:
        _saved(turn, turn_id[turn.index])
    call_id = {(t, p): pk for t, p, pk in _json(call_ids)}
    for call in calls_added:
        if call.turn_id is None:
            call.turn_id = turn_id[call.turn_index]
        _saved(call, call_id[(call.turn_index, call.position)])
    settle(write, int(last_seq), cancel_requested_at is not None, list(placed.values()))


def _changes(model: type, changes: list[Change], placed: dict[int, Placed]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.obj.pk,
            "expected": c.expected,
            "changes": _placed(changes_values(model, c.fields), placed.get(id(c.obj))),
        }
        for c in changes
    ]


def _placed(values: dict[str, Any], placed: Placed | None) -> dict[str, Any]:
    """A row's values with its recorded value named by its event's place, not copied."""
    if placed is not None:
        values[placed.spec.attr] = None
        values[placed.spec.seq_field] = placed.place + 1
    return values


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _fenced_out(exc: IntegrityError) -> bool:
    """The error of a write that was refused (see FENCE_CONSTRAINT)."""
    diag = getattr(exc.__cause__, "diag", None)
    return diag is not None and diag.constraint_name == FENCE_CONSTRAINT


def _saved(obj: Any, pk: Any) -> None:
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = connection.alias


# -- rows as the write statement's JSON parameters --------------------------------------


class _Encoder(StorableJSONEncoder):
    """The storage rule's encoder, with full-precision times (Django's encoder cuts them
    to milliseconds) and UUIDs as the text the columns take."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime | date):
            return o.isoformat()
        if isinstance(o, UUID | Decimal):
            return str(o)
        return super().default(o)


def dumps(value: Any) -> str:
    """JSON for a statement parameter, by the storage rule (fields.py)."""
    return json.dumps(value, cls=_Encoder, separators=(",", ":"))


def _value(field: models.Field, obj: Any) -> Any:
    if isinstance(field, RecordedField) and getattr(obj, field.seq_field) is not None:
        return None  # its event holds it (RecordedField.pre_save, as the ORM saves it)
    value = getattr(obj, field.attname)
    if isinstance(field, models.JSONField) or value is None:
        return value
    if isinstance(field, models.CharField | models.TextField | models.BooleanField):
        return value
    if isinstance(field, models.IntegerField | models.DecimalField | models.DateTimeField):
        return value
    return field.get_prep_value(value)


def row_values(obj: Any) -> dict[str, Any]:
    """Every column of `obj` but its primary key (a row to add)."""
    return {f.attname: _value(f, obj) for f in type(obj)._meta.concrete_fields if not f.primary_key}


def changes_values(model: type, changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` (field name -> value) keyed by column, as `write` takes them."""
    out = {}
    for name, value in changes.items():
        field = model._meta.get_field(name)
        if field.is_relation:
            value = getattr(value, "pk", value)
        out[field.attname] = value
    return out
