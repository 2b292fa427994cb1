"""The only writer: every state change of a run, turn or tool call happens here.

Each function commits the row changes and their RunEvents in one transaction.
A run row is written with one compare-and-set `UPDATE ... RETURNING` that also
allocates the event seqs (gap-free per run) and, for the engine, checks the
lease epoch: a worker that lost its lease writes nothing (LeaseLost).
Side effects (enqueueing, signals) happen on commit, never inside a transition.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone
from django_fsm import TransitionNotAllowed

from . import signals, wakeups
from .agents import Agent, get_agent
from .conf import agentrun_settings
from .content import (
    BLOCK_TYPES,
    StoredResult,
    has_cache_control,
    stored_result,
    validate_blocks,
)
from .exceptions import (
    ApprovalError,
    ConcurrentUpdate,
    IdempotencyConflict,
    InvalidArguments,
    InvalidInput,
    InvalidToken,
    InvalidTransition,
    LeaseLost,
    RunNotActive,
    UnknownAgent,
)
from .fields import check_json, check_text, storable_text
from .models import Run, RunEvent, ToolCall, Turn
from .states import (
    ResultSource,
    RunState,
    ToolCallState,
    TurnState,
)
from .tools import ToolArgumentsError, arguments_hash

logger = logging.getLogger(__name__)

Event = tuple[str, dict[str, Any]]
TOKEN_SALT = "django_agentrun.approval"


# --------------------------------------------------------------------------- primitives


@dataclass(frozen=True)
class Lease:
    """Proof that this worker may advance the run: its owner string and the epoch it
    claimed. `valid_until` (time.monotonic()) is when it runs out at the latest, taken
    before the claim was sent: the holder must stop executing before then unless renewed."""

    run_id: uuid.UUID
    owner: str
    epoch: int
    valid_until: float = float("inf")


def _clock(seconds: float = 0.0) -> tuple[str, list[Any]]:
    """SQL for the current time plus `seconds`, by the database's clock on Postgres (app
    servers' clocks differ; lease expiry is judged by one clock). SQLite runs on the app's
    host: its time is the app's."""
    if connection.vendor == "postgresql":
        if not seconds:
            return "statement_timestamp()", []
        return "(statement_timestamp() + %s * interval '1 second')", [float(seconds)]
    return "%s", [_db(Run, "lease_expires_at", timezone.now() + timedelta(seconds=seconds))]


def database_now() -> datetime:
    """The database's current time (one query on Postgres)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        value = cursor.fetchone()[0]
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


class DatabaseNow:
    """A field value written as the database's current time (see _clock)."""


def _db(model: type, name: str, value: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, connection)


def _assignments(model: type, fields: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """`column = %s` clauses and their database values for an UPDATE of `model`
    (a foreign key is written as its target's id; DatabaseNow as the database's time)."""
    qn = connection.ops.quote_name
    sets, params = [], []
    for name, value in fields.items():
        field = model._meta.get_field(name)
        if isinstance(value, DatabaseNow):
            sql, extra = _clock()
            sets.append(f"{qn(field.column)} = {sql}")
            params += extra
            continue
        target = field
        if field.is_relation:
            value = getattr(value, "pk", value)
            target = field.target_field
        sets.append(f"{qn(field.column)} = %s")
        params.append(target.get_db_prep_save(value, connection))
    return sets, params


# The columns the engine writes of each event, in the order its INSERTs list them.
_EVENT_COLUMNS = ("run_id", "seq", "type", "payload", "created_at")


def _write_run(
    run: Run,
    events: list[Event],
    *,
    lease: Lease | None = None,
    old_state: str | None = None,
    fields: dict[str, Any] | None = None,
    incr: dict[str, Any] | None = None,
    rows: list[Deferred] | None = None,
    last: bool = False,
) -> bool:
    """One fenced compare-and-set UPDATE of the run row, then its events in one INSERT.

    `rows` are deferred turn/tool-call updates of the same transaction: on Postgres they
    travel in the same statement, elsewhere they are sent first.

    `last`: the caller's write_unit() sends nothing after this write. If nothing was sent
    before it either, the write is held and sent at the unit's end as one statement in
    autocommit mode (see write_unit); it then returns False and the unit records whether
    a cancel is requested.

    Returns whether a cancel is requested. Runs inside transaction.atomic() or a
    write_unit().
    """
    now = timezone.now()
    fields = {**(fields or {}), "updated_at": now}
    if old_state is not None:
        fields["state"] = run.state
    qn = connection.ops.quote_name
    sets, params = _assignments(Run, fields)
    for name, delta in (incr or {}).items():
        column = qn(Run._meta.get_field(name).column)
        sets.append(f"{column} = {column} + %s")
        params.append(_db(Run, name, delta))
    sets.append(f"{qn('last_seq')} = {qn('last_seq')} + %s")
    params.append(len(events))
    where = [f"{qn('id')} = %s"]
    params.append(_db(Run, "id", run.pk))
    if old_state is not None:
        where.append(f"{qn('state')} = %s")
        params.append(old_state)
    if lease is not None:
        where.append(f"{qn('lease_epoch')} = %s AND {qn('lease_owner')} = %s")
        params += [lease.epoch, lease.owner]

    def update_sql(gate: str = "") -> str:
        return (
            f"UPDATE {qn(Run._meta.db_table)} SET {', '.join(sets)} "
            f"WHERE {' AND '.join(where)}{gate} "
            # The raw column, not `IS NOT NULL`: SQLite 3.40 evaluates that wrongly in RETURNING.
            f"RETURNING {qn('last_seq')}, {qn('cancel_requested_at')}"
        )

    pending = list(rows or [])
    if rows:
        rows.clear()
    together = bool(events) and connection.vendor == "postgresql"

    def send(alone: bool) -> bool:
        """alone: the statement is its own transaction (autocommit), so it must refuse as
        a whole (see _with_events)."""
        statement, values = update_sql(), params
        if together:
            # One round trip: the events are inserted only if the fenced UPDATE matched.
            statement, values = _with_events(
                update_sql, params, run.pk, events, now, pending, alone
            )
        else:
            for update in pending:
                _apply(update)
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, values)
                row = cursor.fetchone()
        except IntegrityError as exc:
            if not (alone and _tripped(exc)):
                raise
            row = None
        if row is None:
            _refused(run, lease, old_state)
        if together:
            for item, value in zip(pending, row[2:], strict=True):
                if isinstance(item, RowInsert):
                    item.assign(value)
                elif value != 1:
                    raise ConcurrentUpdate(f"{item.model.__name__} {item.pk} changed concurrently")
        last_seq, cancel_requested = int(row[0]), row[1] is not None
        first = last_seq - len(events) + 1
        if events and not together:
            _insert_events(run.pk, first, events, now)
        run.last_seq = last_seq
        for name, value in fields.items():
            if name != "state":
                setattr(run, name, timezone.now() if isinstance(value, DatabaseNow) else value)
        for name, delta in (incr or {}).items():
            setattr(run, name, getattr(run, name) + delta)
        return cancel_requested

    unit = _idle_unit() if last and together else None
    if unit is not None:
        unit.hold(send)
        return False
    return send(False)


def _tripped(exc: IntegrityError) -> bool:
    """The error of a lone write that refused: its events got no seq (see _with_events)."""
    diag = getattr(exc.__cause__, "diag", None)
    return (
        diag is not None
        and diag.table_name == RunEvent._meta.db_table
        and diag.column_name == "seq"
    )


def _with_events(
    update_sql: Callable[[str], str],
    params: list[Any],
    run_id: Any,
    events: list[Event],
    now: datetime,
    rows: list[Deferred],
    alone: bool = False,
) -> tuple[str, list[Any]]:
    """Postgres: the deferred row inserts and updates, the run UPDATE and its events'
    INSERT as one statement (data-modifying CTEs); the seqs come from the UPDATE's
    RETURNING, so they stay gap-free; each row update's count comes back to be checked,
    each insert's new ids (in insertion order: ids come from the sequence in that order).

    alone (autocommit): nothing may commit unless every part matched, and a statement's
    CTEs all run to completion, whatever the others did. So the run UPDATE matches only
    if every row update matched too, and the events take their seqs from it: when it
    matched nothing they are NULL, the NOT NULL constraint fails the statement, and an
    error undoes all of it (_tripped recognizes that error)."""
    qn = connection.ops.quote_name
    payload = RunEvent._meta.get_field("payload")
    values = ", ".join(["(%s, %s, %s::jsonb)"] * len(events))
    columns = ", ".join(qn(c) for c in _EVENT_COLUMNS)
    pk = qn("id")
    ctes = "".join(
        f"c{i} AS ({u.sql} RETURNING {pk}), "
        if isinstance(u, RowInsert)
        else f"c{i} AS ({u.sql} RETURNING 1), "
        for i, u in enumerate(rows)
    )
    counts = "".join(
        f", (SELECT array_agg({pk} ORDER BY {pk}) FROM c{i})"
        if isinstance(u, RowInsert)
        else f", (SELECT count(*) FROM c{i})"
        for i, u in enumerate(rows)
    )
    seq = qn("last_seq")
    if alone:
        gate = "".join(
            f" AND EXISTS (SELECT 1 FROM c{i})"
            for i, u in enumerate(rows)
            if not isinstance(u, RowInsert)
        )
        source = f"(SELECT {seq} FROM r) - %s + v.i, v.t, v.p, %s FROM"
    else:
        gate, source = "", f"r.{seq} - %s + v.i, v.t, v.p, %s FROM r,"
    sql = (
        f"WITH {ctes}r AS ({update_sql(gate)}), "
        f"e AS (INSERT INTO {qn(RunEvent._meta.db_table)} ({columns}) "
        f"SELECT %s, {source} (VALUES {values}) AS v(i, t, p)) "
        f"SELECT r.{seq}, r.{qn('cancel_requested_at')}{counts} FROM r"
    )
    params = [p for u in rows for p in u.params] + params
    extra: list[Any] = [_db(Run, "id", run_id), len(events), _db(RunEvent, "created_at", now)]
    for i, (kind, data) in enumerate(events, start=1):
        extra += [i, kind, payload.get_db_prep_save(data, connection)]
    return sql, params + extra


class _Unit:
    """The state of one write_unit() on this thread's connection."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.open = False  # a transaction was begun for the unit
        self.alone = False  # the held write is being sent alone, in autocommit
        self.held: Callable[[bool], bool] | None = None
        self.callbacks: list[Callable[[], Any]] = []
        self.cancel_requested = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        """connection.execute_wrapper: every statement but the lone held write runs in
        the unit's transaction, begun at the first of them."""
        if not self.open and not self.alone:
            self.begin()
        return execute(sql, params, many, context)

    def hold(self, send: Callable[[bool], bool]) -> None:
        if self.held is not None:  # a second write: both go in a transaction
            self.begin()
        if self.open:
            self.cancel_requested |= send(False)
        else:
            self.held = send

    def begin(self) -> None:
        if connection.in_atomic_block:
            raise RuntimeError(
                "transaction.atomic() was entered inside a write unit before its first statement"
            )
        self.stack.enter_context(transaction.atomic())
        self.open = True
        held, self.held = self.held, None
        if held is not None:
            self.cancel_requested |= held(False)

    def finish(self) -> None:
        held, self.held = self.held, None
        if held is None:
            return
        self.alone = not self.open
        self.cancel_requested |= held(self.alone)


_local = threading.local()


@contextmanager
def write_unit() -> Iterator[_Unit | None]:
    """transaction.atomic() for the engine's writes, begun lazily (Postgres).

    A durable engine write is usually one statement (a data-modifying CTE, see
    _with_events). When the unit's only statement is its `last=True` run write, that
    statement is sent alone in autocommit mode: one round trip instead of three (BEGIN,
    the statement, COMMIT), and still all or nothing: the statement fails as a whole
    unless the fence and every row update in it matched (see _with_events). Any other
    statement begins a real transaction first (an execute
    wrapper sees every statement), and a held write is sent inside it. On-commit
    callbacks registered through _after_commit run after the unit commits; an exception
    sends nothing held and rolls back what was begun.

    Elsewhere (SQLite, or inside a caller's transaction) it is transaction.atomic().
    """
    if (
        connection.vendor != "postgresql"
        or connection.in_atomic_block
        or not connection.get_autocommit()  # AUTOCOMMIT=False: Django never commits alone
        or getattr(_local, "unit", None) is not None
    ):
        with transaction.atomic():
            yield None
        return
    with ExitStack() as stack:
        unit = _Unit(stack)
        _local.unit = unit
        try:
            with connection.execute_wrapper(unit):
                yield unit
                unit.finish()
        finally:
            _local.unit = None
    for callback in unit.callbacks:  # committed
        callback()


def _idle_unit() -> _Unit | None:
    """The current write unit if nothing has been sent in it yet."""
    unit = getattr(_local, "unit", None)
    return unit if unit is not None and not unit.open else None


def _after_commit(callback: Callable[[], Any]) -> None:
    """transaction.on_commit that also waits for a write unit's lone write."""
    unit = getattr(_local, "unit", None)
    if unit is not None:
        unit.callbacks.append(callback)
    else:
        transaction.on_commit(callback)


def _refused(run: Run, lease: Lease | None, old_state: str | None) -> None:
    current = Run.objects.filter(pk=run.pk).values("state", "lease_epoch", "lease_owner").first()
    if current is None:
        raise ConcurrentUpdate(f"Run {run.pk} no longer exists")
    if lease is not None and (
        current["lease_epoch"] != lease.epoch or current["lease_owner"] != lease.owner
    ):
        raise LeaseLost(f"Run {run.pk}: lease epoch {lease.epoch} was superseded")
    if old_state is None or current["state"] == old_state:  # a lone write's row update missed
        raise ConcurrentUpdate(f"Run {run.pk}: one of its turns or tool calls changed concurrently")
    raise ConcurrentUpdate(
        f"Run {run.pk} changed concurrently: expected state {old_state!r}, found {current['state']!r}"
    )


@dataclass
class RowUpdate:
    """A compare-and-set UPDATE of one turn or tool call, built but not yet sent."""

    model: type
    pk: Any
    sql: str
    params: list[Any]


@dataclass
class RowInsert:
    """An INSERT of new turns or tool calls, built but not yet sent; their ids are set
    when it is (`assign`)."""

    objs: list[Any]
    sql: str
    params: list[Any]

    def assign(self, ids: list[Any]) -> None:
        for obj, pk in zip(self.objs, ids, strict=True):
            obj.pk = pk
            obj._state.adding = False
            obj._state.db = connection.alias


Deferred = RowUpdate | RowInsert


def _save(
    obj: Turn | ToolCall,
    old_state: str | None,
    *,
    defer: list[Deferred] | None = None,
    **fields: Any,
) -> None:
    """Compare-and-set UPDATE of a turn or tool call (state from memory, other fields given).

    Raw SQL on the hot path. With `defer`, the statement is appended there instead, and
    the next `_write_run(..., rows=defer)` sends it together with the run's write."""
    model = type(obj)
    if defer and obj.pk is None:  # its INSERT is still pending: send what is pending
        _flush(defer)
    if old_state is not None:
        fields["state"] = obj.state
    qn = connection.ops.quote_name
    sets, params = _assignments(model, fields)
    sql = f"UPDATE {qn(model._meta.db_table)} SET {', '.join(sets)} WHERE {qn('id')} = %s"
    params.append(obj.pk)
    if old_state is not None:
        sql += f" AND {qn('state')} = %s"
        params.append(old_state)
    for name, value in fields.items():
        if name != "state":
            setattr(obj, name, value)
    update = RowUpdate(model, obj.pk, sql, params)
    if defer is None:
        _apply(update)
        return
    if any(isinstance(u, RowUpdate) and u.model is model and u.pk == obj.pk for u in defer):
        # Statements of one CTE share a snapshot: a second update of the same row must
        # see the first, so send what is pending now.
        _flush(defer)
    defer.append(update)


def _flush(defer: list[Deferred]) -> None:
    for pending in defer:
        _apply(pending)
    defer.clear()


def _apply(item: Deferred) -> None:
    """Send one deferred statement now."""
    with connection.cursor() as cursor:
        if isinstance(item, RowInsert):
            # RETURNING keeps the VALUES order.
            cursor.execute(f"{item.sql} RETURNING {connection.ops.quote_name('id')}", item.params)
            item.assign([r[0] for r in cursor.fetchall()])
            return
        cursor.execute(item.sql, item.params)
        updated = cursor.rowcount
    if updated != 1:
        raise ConcurrentUpdate(f"{item.model.__name__} {item.pk} changed concurrently")


def insert_rows(objs: list[Any], *, defer: list[Deferred] | None = None) -> None:
    """INSERT new turns or tool calls in one statement and set their ids (RETURNING id),
    without the ORM's per-call query compilation (the engine does this every turn).

    With `defer`, the statement is appended there and sent with the next run write
    (`_write_run(..., rows=defer)`); the ids are set then."""
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    qn = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    params: list[Any] = []
    for obj in objs:
        for field in fields:
            params.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"VALUES {', '.join([row] * len(objs))}"
    )
    insert = RowInsert(list(objs), sql, params)
    if defer is not None:
        defer.append(insert)
    else:
        _apply(insert)


def _insert_events(run_id: Any, first: int, events: list[Event], now: datetime) -> None:
    """Append events in one multi-row INSERT (the model refuses anything but inserts)."""
    qn = connection.ops.quote_name
    payload = RunEvent._meta.get_field("payload")
    run_db = _db(Run, "id", run_id)
    created = _db(RunEvent, "created_at", now)
    row = "(%s, %s, %s, %s, %s)"
    params: list[Any] = []
    for i, (kind, data) in enumerate(events):
        params += [run_db, first + i, kind, payload.get_db_prep_save(data, connection), created]
    columns = ", ".join(qn(c) for c in _EVENT_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(RunEvent._meta.db_table)} ({columns}) VALUES "
            + ", ".join([row] * len(events)),
            params,
        )


def _set_state(obj: Any, target: str) -> str:
    """Apply the django-fsm transition to `target` in memory; return the previous state."""
    old = obj.state
    try:
        getattr(obj, f"to_{target}")()
    except TransitionNotAllowed as exc:
        raise InvalidTransition(
            f"{type(obj).__name__} {obj.pk}: cannot go from '{old}' to '{target}'"
        ) from exc
    return old


def _enqueue(run_id: Any, countdown: float | None = None) -> None:
    """Wake a worker for this run once the transaction commits."""
    _after_commit(lambda: wakeups.send(run_id, countdown))


def wake_again(run: Run) -> None:
    """Send a run that nobody picked up a new wake-up (the reaper), marking when."""
    now = DatabaseNow()
    fields: dict[str, Any] = (
        {"queued_at": now} if run.state == RunState.QUEUED else {"lease_expires_at": now}
    )
    _write_run(run, [("reaper_requeued", {"state": run.state})], fields=fields)
    _enqueue(run.pk)


def enqueue_advance(run_id: Any) -> None:
    """Wake a worker for this run (after the current transaction, if any, commits)."""
    _enqueue(run_id)


def _on_commit_signal(signal: Any, **kwargs: Any) -> None:
    _after_commit(lambda: signal.send(sender=Run, **kwargs))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _user_id(user: Any) -> Any:
    return getattr(user, "pk", None)


def _release_fields() -> dict[str, Any]:
    # Released leases keep a time (the database's): the reaper re-wakes a run nobody
    # picked up since then.
    return {"lease_owner": "", "lease_expires_at": DatabaseNow()}


# --------------------------------------------------------------------------- runs


# Prompt-caching breakpoints a run's input may set: the API takes 4 a request, and the
# model client marks the last tool and the last system block.
INPUT_BREAKPOINTS = 2


def _validate_input(value: Any) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise InvalidInput("The input must not be empty.")
        return value
    if isinstance(value, list) and value:
        for i, block in enumerate(value):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise InvalidInput(f"input[{i}] must be a content block with a 'type'.")
            if block["type"] == "text" and not (
                isinstance(block.get("text"), str) and block["text"].strip()
            ):
                raise InvalidInput(f"input[{i}] is a text block without text.")
            if block["type"] not in BLOCK_TYPES:
                raise InvalidInput(
                    f"input[{i}]: {block['type']} blocks cannot start a run (a run's input holds "
                    f"{', '.join(BLOCK_TYPES)} blocks)."
                )
        # The shapes the Messages API accepts, checked now rather than failing at the model.
        blocks = validate_blocks(value, where="input")
        if sum(1 for block in blocks if has_cache_control(block)) > INPUT_BREAKPOINTS:
            raise InvalidInput(
                f"At most {INPUT_BREAKPOINTS} input blocks may set cache_control: the API allows "
                "4 breakpoints a request, and the engine places 2 (tools and system)."
            )
        return blocks
    raise InvalidInput(
        "The input must be a non-empty string or a non-empty list of content blocks."
    )


def start_run(
    agent: str | Agent,
    input: Any,
    *,
    owner: Any = None,
    idempotency_key: str | None = None,
    metadata: dict[str, Any] | None = None,
    correlation_id: str | None = None,
    deadline: datetime | timedelta | None = None,
) -> Run:
    """Create a queued run of `agent` and enqueue it on commit.

    With an idempotency key, a second call with the same key (per owner) returns
    the first run instead of creating another.
    """
    agent_obj = get_agent(agent) if isinstance(agent, str) else agent
    input = _validate_input(input)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object.")
    check_json(input, "The input")
    check_json(metadata, "metadata")
    check_text(correlation_id, "correlation_id")
    check_text(idempotency_key, "The idempotency key")
    if idempotency_key is not None:
        existing = _existing_run(owner, idempotency_key, agent_obj.name, input)
        if existing is not None:
            return existing
    if isinstance(deadline, timedelta):
        deadline = timezone.now() + deadline
    elif deadline is None and agent_obj.deadline is not None:
        deadline = timezone.now() + agent_obj.deadline
    config = agent_obj.snapshot()
    correlation_id = correlation_id or uuid.uuid4().hex
    try:
        with transaction.atomic():
            run = Run.objects.create(
                agent=agent_obj.name,
                input=input,
                config=config,
                owner=owner,
                idempotency_key=idempotency_key,
                metadata=metadata or {},
                correlation_id=correlation_id,
                deadline=deadline,
                last_seq=1,
            )
            RunEvent.objects.create(
                run=run,
                seq=1,
                type="run_created",
                payload={
                    "run_state": RunState.QUEUED,
                    "agent": run.agent,
                    "input": input,
                    "config": config,
                    "correlation_id": correlation_id,
                    "metadata": run.metadata,
                    "owner": _user_id(owner),
                    "deadline": _iso(deadline),
                },
                created_at=run.created_at,
            )
            _enqueue(run.pk)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = _existing_run(owner, idempotency_key, agent_obj.name, input)
        if existing is None:
            raise
        return existing
    logger.info("Run started run_id=%s agent=%s", run.pk, run.agent)
    return run


def _existing_run(owner: Any, key: str, agent: str, input: Any) -> Run | None:
    run = Run.objects.filter(owner=owner, idempotency_key=key).first()
    if run is not None and (run.agent != agent or run.input != input):
        raise IdempotencyConflict(
            f"Idempotency key {key!r} was used for another run ({run.pk}) with a different "
            "agent or input."
        )
    return run


def _lease_live(run: Run, now: datetime) -> bool:
    return bool(run.lease_owner) and run.lease_expires_at is not None and run.lease_expires_at > now


def cancel_run(run: Run | Any, *, by: Any = None, reason: str = "") -> Run:
    """Ask a run to stop. Applied at once when no worker holds it; otherwise the holder
    sees the request within about a second and closes the turn cleanly."""
    check_text(reason, "The reason")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=getattr(run, "pk", run))
        if run.state == RunState.CANCELLED:
            return run
        if not run.is_active:
            raise RunNotActive(f"Run {run.pk} is {run.state}: there is nothing to cancel.")
        now = timezone.now()
        events: list[Event] = []
        fields: dict[str, Any] = {}
        if run.cancel_requested_at is None:
            fields = {
                "cancel_requested_at": now,
                "cancel_reason": reason,
                "cancel_requested_by": by if getattr(by, "pk", None) else None,
            }
            events.append(("cancel_requested", {"by": _user_id(by), "reason": reason}))
        if run.state in (RunState.QUEUED, RunState.AWAITING_APPROVAL) or not _lease_live(
            run, database_now()
        ):
            reason = reason or run.cancel_reason or "cancelled"
            _close_run(run, RunState.CANCELLED, reason, events, fields=fields)
        else:
            _write_run(run, events, fields=fields)
    logger.info("Cancel requested run_id=%s state=%s", run.pk, run.state)
    return run


def _close_run(
    run: Run,
    target: str,
    reason: str,
    events: list[Event],
    *,
    lease: Lease | None = None,
    fields: dict[str, Any] | None = None,
    message: str | None = None,
    not_started: frozenset[Any] = frozenset(),
) -> None:
    """Close open tool calls and the open turn with synthetic results, then end the run
    as cancelled or timed_out. Completed tool outputs are kept. `not_started`: in_flight
    calls (pks) whose handler is known not to have started."""
    now = timezone.now()
    text = message or (
        f"Cancelled: {reason}" if target == RunState.CANCELLED else f"Timed out: {reason}"
    )
    turn = run.turns.exclude(
        state__in=[TurnState.COMPLETED, TurnState.CANCELLED, TurnState.FAILED]
    ).first()
    if turn is not None:
        for call in turn.tool_calls.open():
            events += _close_call(
                call,
                ToolCallState.CANCELLED,
                _cancel_text(call, text, started=call.pk not in not_started),
                is_error=True,
                source=ResultSource.SYNTHETIC,
            )
        old = _set_state(turn, TurnState.CANCELLED)
        _save(turn, old, finished_at=now)
        events.append(("turn_cancelled", {"turn_index": turn.index, "turn_state": turn.state}))
    old = _set_state(run, target)
    kind = "run_cancelled" if target == RunState.CANCELLED else "run_timed_out"
    events.append((kind, {"run_state": run.state, "reason": reason}))
    _write_run(
        run,
        events,
        lease=lease,
        old_state=old,
        fields={
            **(fields or {}),
            **_release_fields(),
            "stop_reason": target,
            "finished_at": now,
        },
    )
    _on_commit_signal(signals.run_finished, run=run, state=run.state)


def _cancel_text(call: ToolCall, text: str, *, started: bool = True) -> str:
    if call.state == ToolCallState.IN_FLIGHT and started:
        return f"{text}. The tool may have started; its outcome is unknown."
    return f"{text}. The tool was not run."


def resume_run(run: Run | Any, *, by: Any = None) -> Run:
    """Queue a failed, cancelled or timed-out run again; it continues from its history."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=getattr(run, "pk", run))
        now = timezone.now()
        old = _set_state(run, RunState.QUEUED)
        fields: dict[str, Any] = {
            "error_code": "",
            "error_message": "",
            "failure_phase": "",
            "stop_reason": "",
            "cancel_requested_at": None,
            "cancel_reason": "",
            "cancel_requested_by": None,
            "recovery_attempts": 0,
            "queued_at": now,
            "finished_at": None,
            **_release_fields(),
        }
        if run.deadline is not None and run.deadline <= now:
            # A passed deadline would end it again at once. The agent's own time limit
            # starts over; a one-off deadline given to start_run is dropped.
            limit = _agent_deadline_seconds(run)
            fields["deadline"] = now + timedelta(seconds=limit) if limit else None
        _write_run(
            run,
            [("run_resumed", {"run_state": run.state, "by": _user_id(by), "from": old})],
            old_state=old,
            fields=fields,
        )
        _enqueue(run.pk)
    logger.info("Run resumed run_id=%s", run.pk)
    return run


def _agent_deadline_seconds(run: Run) -> float | None:
    """The agent's time limit for a run, from its configuration snapshot (runs created
    before it was snapshotted: the agent as registered now)."""
    if "deadline_seconds" in (run.config or {}):
        return run.config["deadline_seconds"]
    try:
        deadline = get_agent(run.agent).deadline
    except UnknownAgent:
        return None
    return deadline.total_seconds() if deadline else None


# --------------------------------------------------------------------------- approvals


def approval_token(call: ToolCall) -> str:
    """A signed resume token bound to this call and the hash of its arguments."""
    return signing.dumps({"tc": call.pk, "h": call.arguments_hash}, salt=TOKEN_SALT)


def check_approval_token(call: ToolCall, token: str) -> None:
    try:
        data = signing.loads(
            token, salt=TOKEN_SALT, max_age=agentrun_settings.APPROVAL_TOKEN_MAX_AGE
        )
    except signing.BadSignature as exc:
        raise InvalidToken("The approval token is invalid or expired.") from exc
    if data.get("tc") != call.pk or data.get("h") != call.arguments_hash:
        raise InvalidToken("The approval token does not match this tool call and its arguments.")


def _lock_call(tool_call: ToolCall | Any) -> tuple[ToolCall, Run]:
    pk = getattr(tool_call, "pk", tool_call)
    run_id = ToolCall.objects.filter(pk=pk).values_list("run_id", flat=True).first()
    if run_id is None:
        raise ApprovalError(f"Tool call {pk} does not exist.")
    # Lock order: run, then call (the engine writes in the same order).
    run = Run.objects.select_for_update().get(pk=run_id)
    call = ToolCall.objects.select_for_update().select_related("turn").get(pk=pk)
    return call, run


def _after_decision(run: Run, call: ToolCall, events: list[Event]) -> None:
    """When no call of the turn waits for a person any more, the run goes on."""
    waiting = call.turn.tool_calls.pending_decision().exclude(pk=call.pk).exists()
    if run.state == RunState.AWAITING_APPROVAL and not waiting:
        old = _set_state(run, RunState.AWAITING_TOOL)
        events.append(("run_continued", {"run_state": run.state}))
        _write_run(run, events, old_state=old, fields=_release_fields())
        _enqueue(run.pk)
    else:
        _write_run(run, events)


def approve_tool_call(
    tool_call: ToolCall | Any,
    *,
    by: Any,
    note: str = "",
    arguments: dict[str, Any] | None = None,
    token: str | None = None,
) -> ToolCall:
    """Approve a waiting call (optionally with edited arguments, re-validated); twice is a no-op."""
    check_text(note, "The note")
    with transaction.atomic():
        call, run = _lock_call(tool_call)
        if call.approved and call.state != ToolCallState.AWAITING_APPROVAL and arguments is None:
            return call
        if call.state != ToolCallState.AWAITING_APPROVAL:
            raise ApprovalError(
                f"Tool call {call.tool_call_id} is {call.state}, not awaiting approval."
            )
        if token is not None:
            check_approval_token(call, token)
        fields: dict[str, Any] = {
            "approved": True,
            "decided_by": by if getattr(by, "pk", None) else None,
            "decided_at": timezone.now(),
            "decision_note": note,
        }
        payload: dict[str, Any] = {
            "turn_index": call.turn_index,
            "tool_call_id": call.tool_call_id,
            "decision": "approved",
            "by": _user_id(by),
            "note": note,
        }
        if arguments is not None:
            tool = get_agent(run.agent).tools.get(call.name)
            if tool is None:
                raise ApprovalError(f"Tool {call.name} is no longer defined by agent {run.agent}.")
            try:
                canonical = tool.validate(arguments)
            except ToolArgumentsError as exc:
                raise InvalidArguments(str(exc)) from exc
            check_json(canonical, "The arguments")
            if canonical != call.arguments:
                fields.update(
                    original_arguments=call.original_arguments or call.arguments,
                    arguments=canonical,
                    arguments_hash=arguments_hash(call.name, canonical),
                )
                payload["arguments"] = canonical
        old = _set_state(call, ToolCallState.REQUESTED)
        _save(call, old, **fields)
        payload["tool_call_state"] = call.state
        _after_decision(run, call, [("approval_decided", payload)])
    logger.info("Tool call approved run_id=%s tool_call_id=%s", run.pk, call.tool_call_id)
    return call


def reject_tool_call(
    tool_call: ToolCall | Any, *, by: Any, reason: str, token: str | None = None
) -> ToolCall:
    """Decline a waiting call: it closes with an is_error result that tells the model why."""
    check_text(reason, "The reason")
    with transaction.atomic():
        call, run = _lock_call(tool_call)
        if call.state == ToolCallState.REJECTED:
            return call
        if call.state != ToolCallState.AWAITING_APPROVAL:
            raise ApprovalError(
                f"Tool call {call.tool_call_id} is {call.state}, not awaiting approval."
            )
        if token is not None:
            check_approval_token(call, token)
        text = f"A person declined this tool call. Reason: {reason or 'no reason given'}. Do not retry it as is."
        events = _close_call(
            call,
            ToolCallState.REJECTED,
            text,
            is_error=True,
            source=ResultSource.PERSON,
            fields={
                "decided_by": by if getattr(by, "pk", None) else None,
                "decided_at": timezone.now(),
                "decision_note": reason,
            },
            extra={"decision": "rejected", "by": _user_id(by), "note": reason},
            kind="approval_decided",
        )
        _after_decision(run, call, events)
    logger.info("Tool call rejected run_id=%s tool_call_id=%s", run.pk, call.tool_call_id)
    return call


def resolve_tool_call(
    tool_call: ToolCall | Any,
    *,
    by: Any,
    action: str,
    result: Any = None,
    note: str = "",
    token: str | None = None,
) -> ToolCall:
    """A person settles a call whose outcome is unknown: `done` (with its result: a JSON
    value, or a ToolResult), `retry` (one new attempt) or `fail` (an is_error result)."""
    check_text(note, "The note")
    done = stored_result(result) if action == "done" else None  # InvalidContent: nothing written
    with transaction.atomic():
        call, run = _lock_call(tool_call)
        if call.state != ToolCallState.UNKNOWN:
            raise ApprovalError(f"Tool call {call.tool_call_id} is {call.state}, not unknown.")
        if token is not None:
            check_approval_token(call, token)
        decided = {
            "decided_by": by if getattr(by, "pk", None) else None,
            "decided_at": timezone.now(),
            "decision_note": note,
        }
        extra = {"decision": action, "by": _user_id(by), "note": note}
        if action == "done":
            events = _close_call(
                call,
                ToolCallState.SUCCEEDED,
                done,
                is_error=False,
                source=ResultSource.PERSON,
                fields=decided,
                extra=extra,
                kind="tool_call_resolved",
            )
        elif action == "fail":
            text = f"The tool call failed (decided by a person). {note}".strip()
            events = _close_call(
                call,
                ToolCallState.ERRORED,
                text,
                is_error=True,
                source=ResultSource.PERSON,
                fields=decided,
                extra=extra,
                kind="tool_call_resolved",
            )
        elif action == "retry":
            old = _set_state(call, ToolCallState.REQUESTED)
            _save(call, old, unknown_reason="", approved=True, **decided)
            events = [
                (
                    "tool_call_resolved",
                    {
                        "turn_index": call.turn_index,
                        "tool_call_id": call.tool_call_id,
                        "tool_call_state": call.state,
                        **extra,
                    },
                )
            ]
        else:
            raise ApprovalError(f"Unknown action {action!r}: use done, retry or fail.")
        _after_decision(run, call, events)
    logger.info(
        "Tool call resolved run_id=%s tool_call_id=%s action=%s", run.pk, call.tool_call_id, action
    )
    return call


# Runs no worker advances, whose history a person may repair before resume_run.
_REPAIRABLE = (RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT)


def replace_tool_result(
    tool_call: ToolCall | Any, *, by: Any, result: Any, is_error: bool = False, note: str = ""
) -> ToolCall:
    """Repair a stopped run's history: replace a closed call's result (a JSON value or a
    ToolResult) in a failed, cancelled or timed-out run, e.g. one the Messages API
    refused (`history_rejected`). The call keeps its state; the result is marked as a
    person's, and a `tool_result_replaced` event says who and why. resume_run then
    sends the history with the new result."""
    check_text(note, "The note")
    stored = stored_result(result)  # InvalidContent: nothing written
    with transaction.atomic():
        call, run = _lock_call(tool_call)
        if run.state not in _REPAIRABLE:
            raise InvalidTransition(
                f"Run {run.pk} is {run.state}: tool results can be replaced only in a failed, "
                "cancelled or timed-out run."
            )
        if not call.is_closed:
            raise InvalidTransition(
                f"Tool call {call.tool_call_id} is {call.state}: only a closed call's result "
                "can be replaced."
            )
        _save(
            call,
            None,
            result=stored.value,
            result_format=stored.format,
            is_error=is_error,
            result_source=ResultSource.PERSON,
        )
        payload = {
            "turn_index": call.turn_index,
            "tool_call_id": call.tool_call_id,
            "tool_call_state": call.state,
            "result": stored.value,
            "result_format": str(stored.format),
            "is_error": is_error,
            "source": ResultSource.PERSON,
            "by": _user_id(by),
            "note": note,
        }
        _write_run(run, [("tool_result_replaced", payload)])
    logger.info(
        "Tool result replaced run_id=%s tool_call_id=%s by=%s",
        run.pk,
        call.tool_call_id,
        _user_id(by),
    )
    return call


def _close_call(
    call: ToolCall,
    target: str,
    result: Any,
    *,
    is_error: bool,
    source: str,
    fields: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    kind: str = "tool_call_finished",
    defer: list[Deferred] | None = None,
) -> list[Event]:
    """Close a tool call with its result (CAS on its state); returns its event. `result`:
    a StoredResult, or a JSON value (e.g. the text of a synthetic result)."""
    stored = result if isinstance(result, StoredResult) else StoredResult(result)
    old = _set_state(call, target)
    _save(
        call,
        old,
        defer=defer,
        result=stored.value,
        result_format=stored.format,
        is_error=is_error,
        result_source=source,
        finished_at=timezone.now(),
        **(fields or {}),
    )
    return [
        (
            kind,
            {
                "turn_index": call.turn_index,
                "tool_call_id": call.tool_call_id,
                "tool_call_state": call.state,
                "result": stored.value,
                "result_format": str(stored.format),
                "is_error": is_error,
                "source": source,
                **(extra or {}),
            },
        )
    ]


# --------------------------------------------------------------------------- engine writes


def claim_run(run_id: Any, owner: str, *, steal_from: str | None = None) -> Lease | None:
    """Take the run's lease if it is free or expired (or held by `steal_from`, a dead
    local process). Bumps the epoch; counts a recovery when a previous holder never
    released it. None: another live holder, or nothing to advance."""
    claimed = claim_and_load(run_id, owner, steal_from=steal_from, history=False)
    return claimed.lease if claimed else None


@dataclass
class Claimed:
    """What a claim returns: the lease, the run row, and its turns and tool calls (in
    order), read in the same round trip."""

    lease: Lease
    run: Run
    turns: list[Turn]
    calls: list[ToolCall]
    took_over: bool = False


def claim_and_load(
    run_id: Any, owner: str, *, steal_from: str | None = None, history: bool = True
) -> Claimed | None:
    """claim_run, returning the claimed row (UPDATE ... RETURNING) and, with `history`,
    the run's turns and tool calls. On Postgres with client-side binding (Django's
    default) the three statements go in one round trip.

    A released lease is taken first (the usual case, no recovery counted); only if there
    is none is the lease taken over from a holder that never released it: expired by the
    database's clock, or `steal_from` (a holder known to be dead). A take-over counts a
    recovery (`Claimed.took_over`)."""
    if not steal_from:
        claimed = _claim(run_id, owner, takeover=False, steal_from=None, history=history)
        if claimed is not None:
            return claimed
    return _claim(run_id, owner, takeover=True, steal_from=steal_from, history=history)


def _claim(
    run_id: Any, owner: str, *, takeover: bool, steal_from: str | None, history: bool
) -> Claimed | None:
    started = time.monotonic()  # before the statement: the lease is valid no longer than this
    qn = connection.ops.quote_name
    claimable = [RunState.QUEUED, RunState.RUNNING, RunState.AWAITING_TOOL]
    expires_sql, expires_params = _clock(agentrun_settings.LEASE_SECONDS)
    params: list[Any] = [
        owner,
        *expires_params,
        _db(Run, "updated_at", timezone.now()),
        _db(Run, "id", run_id),
        *claimable,
    ]
    if takeover:
        now_sql, now_params = _clock()
        free = f"{qn('lease_owner')} <> '' AND ({qn('lease_expires_at')} < {now_sql}"
        params += now_params
        if steal_from:
            free += f" OR {qn('lease_owner')} = %s"
            params.append(steal_from)
        free += ")"
    else:
        free = f"{qn('lease_owner')} = ''"
    claim = (
        f"UPDATE {qn(Run._meta.db_table)} SET {qn('lease_owner')} = %s, "
        f"{qn('lease_expires_at')} = {expires_sql}, {qn('updated_at')} = %s, "
        f"{qn('lease_epoch')} = {qn('lease_epoch')} + 1"
        + (f", {qn('recovery_attempts')} = {qn('recovery_attempts')} + 1 " if takeover else " ")
        + f"WHERE {qn('id')} = %s AND {qn('state')} IN (%s, %s, %s) AND {free} "
        f"RETURNING {_columns(Run)}"
    )
    statements = [(claim, params)]
    if history:
        run_db = _db(Run, "id", run_id)
        statements += [
            (_select_sql(Turn, "run_id", ("index",)), [run_db]),
            (_select_sql(ToolCall, "run_id", ("turn_index", "position")), [run_db]),
        ]
    results = _execute_many(statements)
    if not results[0]:
        return None
    run = _instances(Run, results[0])[0]
    turns = _instances(Turn, results[1]) if history else []
    calls = _instances(ToolCall, results[2]) if history else []
    lease = Lease(
        run_id=run.pk,
        owner=owner,
        epoch=run.lease_epoch,
        valid_until=started + agentrun_settings.LEASE_SECONDS,
    )
    return Claimed(lease, run, turns, calls, took_over=takeover)


def _execute_many(statements: list[tuple[str, list[Any]]]) -> list[list[tuple]]:
    """Run statements that return rows; one round trip where the driver allows several
    statements in one query (psycopg's client-side binding cursor)."""
    with connection.cursor() as cursor:
        if len(statements) > 1 and _multi_statement(cursor):
            cursor.execute(
                "; ".join(sql for sql, _ in statements), [p for _, ps in statements for p in ps]
            )
            results = [cursor.fetchall()]
            for _ in statements[1:]:
                cursor.nextset()
                results.append(cursor.fetchall())
            return results
        results = []
        for sql, params in statements:
            cursor.execute(sql, params)
            results.append(cursor.fetchall())
        return results


def _multi_statement(cursor: Any) -> bool:
    """Several statements with their results in one query: psycopg 3's client-side binding
    cursor only (psycopg2 returns the last statement's rows only; psycopg 3's server-side
    binding refuses several statements). Never imports a driver the project does not use."""
    psycopg = sys.modules.get("psycopg")
    return (
        connection.vendor == "postgresql"
        and psycopg is not None
        and isinstance(cursor.cursor, psycopg.ClientCursor)
    )


def _utc_timestamps() -> bool:
    """Read timestamps as UTC `timestamp` (Postgres, USE_TZ): psycopg parses that type in
    C, while Django's timestamptz loader is a Python subclass (about 2 µs a value, the
    largest part of loading a run's history). _instances puts the UTC tzinfo back."""
    return connection.vendor == "postgresql" and bool(settings.USE_TZ)


def _columns(model: type) -> str:
    """The model's concrete columns, in field order (what _instances expects)."""
    qn = connection.ops.quote_name
    utc = _utc_timestamps()
    return ", ".join(
        f"({qn(f.column)} AT TIME ZONE 'UTC')"
        if utc and isinstance(f, models.DateTimeField)
        else qn(f.column)
        for f in model._meta.concrete_fields
    )


def _aware_utc(value: datetime | None, expression: Any, connection: Any) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None else None


def _select_sql(model: type, where: str, order: tuple[str, ...]) -> str:
    qn = connection.ops.quote_name
    return (
        f"SELECT {_columns(model)} FROM {qn(model._meta.db_table)} WHERE {qn(where)} = %s "
        f"ORDER BY {', '.join(qn(c) for c in order)}"
    )


_CONVERTERS: dict[tuple[str, bool, type], list[tuple[int, Any, list[Any]]]] = {}


def _instances(model: type, rows: list[tuple]) -> list[Any]:
    """Model instances from rows of _columns(model), through the fields' and the
    backend's converters (what a queryset applies), without compiling a query."""
    utc = _utc_timestamps()
    key = (connection.vendor, utc, model)
    converters = _CONVERTERS.get(key)
    if converters is None:
        converters = []
        for i, field in enumerate(model._meta.concrete_fields):
            col = field.get_col(model._meta.db_table)
            funcs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if utc and isinstance(field, models.DateTimeField):
                funcs = [_aware_utc, *funcs]
            if funcs:
                converters.append((i, col, funcs))
        _CONVERTERS[key] = converters
    alias = connection.alias
    out = []
    for row in rows:
        values = list(row)
        for i, col, funcs in converters:
            value = values[i]
            for func in funcs:
                value = func(value, col, connection)
            values[i] = value
        out.append(model.from_db(alias, None, values))
    return out


def take_lease(run: Run, owner: str, *, seconds: float | None = None) -> Lease:
    """Take the lease of a run whose row the caller holds locked (the reaper), fencing out
    any previous holder by bumping the epoch."""
    started = time.monotonic()
    seconds = agentrun_settings.LEASE_SECONDS if seconds is None else seconds
    expires_sql, expires_params = _clock(seconds)
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(Run._meta.db_table)} SET {qn('lease_owner')} = %s, "
            f"{qn('lease_expires_at')} = {expires_sql}, {qn('lease_epoch')} = %s "
            f"WHERE {qn('id')} = %s RETURNING {qn('lease_expires_at')}",
            [owner, *expires_params, run.lease_epoch + 1, _db(Run, "id", run.pk)],
        )
        expires = cursor.fetchone()[0]
    run.lease_owner, run.lease_epoch = owner, run.lease_epoch + 1
    run.lease_expires_at = expires if isinstance(expires, datetime) else timezone.now()
    return Lease(run.pk, owner, run.lease_epoch, valid_until=started + seconds)


def release_lease(lease: Lease) -> bool:
    """Give the lease back (best effort; an expired lease is harmless). Whether it was held."""
    return 1 == _update_run(
        lease.run_id,
        _release_fields(),
        "lease_epoch = %s AND lease_owner = %s",
        [lease.epoch, lease.owner],
    )


def _update_run(run_id: Any, fields: dict[str, Any], where: str, params: list[Any]) -> int:
    qn = connection.ops.quote_name
    sets, values = _assignments(Run, fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(Run._meta.db_table)} SET {', '.join(sets)} "
            f"WHERE {qn('id')} = %s AND {where}",
            [*values, _db(Run, "id", run_id), *params],
        )
        return cursor.rowcount


def renew_lease(lease: Lease) -> tuple[bool, bool]:
    """Extend the lease (by the database's clock); returns (still held, cancel requested)."""
    expires_sql, expires_params = _clock(agentrun_settings.LEASE_SECONDS)
    qn = connection.ops.quote_name
    sql = (
        f"UPDATE {qn(Run._meta.db_table)} SET {qn('lease_expires_at')} = {expires_sql} "
        f"WHERE {qn('id')} = %s AND {qn('lease_epoch')} = %s AND {qn('lease_owner')} = %s "
        f"RETURNING {qn('cancel_requested_at')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [*expires_params, _db(Run, "id", lease.run_id), lease.epoch, lease.owner]
        )
        row = cursor.fetchone()
    if row is None:
        return False, False
    return True, row[0] is not None


def poll_cancel(lease: Lease) -> tuple[bool, bool]:
    """Cheap read: (still held, cancel requested)."""
    row = (
        Run.objects.filter(pk=lease.run_id)
        .values_list("lease_epoch", "lease_owner", "cancel_requested_at")
        .first()
    )
    if row is None:
        return False, False
    return (row[0] == lease.epoch and row[1] == lease.owner), row[2] is not None


def fenced(run: Run, lease: Lease, events: list[Event], **kwargs: Any) -> bool:
    """Engine write of the run row under the lease (see _write_run)."""
    return _write_run(run, events, lease=lease, **kwargs)


def run_failed(
    run: Run,
    lease: Lease | None,
    *,
    code: str,
    message: str,
    phase: str,
    events: list[Event] | None = None,
    turn: Turn | None = None,
) -> None:
    """End the run as failed with a structured error (inside the caller's transaction)."""
    message = storable_text(message)
    events = list(events or [])
    now = timezone.now()
    if turn is not None and turn.state not in (
        TurnState.COMPLETED,
        TurnState.CANCELLED,
        TurnState.FAILED,
    ):
        for call in turn.tool_calls.open():
            events += _close_call(
                call,
                ToolCallState.CANCELLED,
                _cancel_text(call, f"Run failed ({code})"),
                is_error=True,
                source=ResultSource.SYNTHETIC,
            )
        old_turn = _set_state(turn, TurnState.FAILED)
        _save(turn, old_turn, finished_at=now)
        events.append(("turn_failed", {"turn_index": turn.index, "turn_state": turn.state}))
    old = _set_state(run, RunState.FAILED)
    events.append(
        (
            "run_failed",
            {
                "run_state": run.state,
                "error_code": code,
                "error_message": message,
                "phase": phase,
                "last_checkpoint": run.last_seq,
            },
        )
    )
    _write_run(
        run,
        events,
        lease=lease,
        old_state=old,
        fields={
            "error_code": code,
            "error_message": message,
            "failure_phase": phase,
            "last_checkpoint": run.last_seq,
            "finished_at": now,
            **_release_fields(),
        },
    )
    logger.warning("Run failed run_id=%s code=%s phase=%s", run.pk, code, phase)
    _on_commit_signal(signals.run_finished, run=run, state=run.state)


def close_run(
    run: Run,
    lease: Lease | None,
    target: str,
    reason: str,
    events: list[Event] | None = None,
    *,
    not_started: frozenset[Any] = frozenset(),
) -> None:
    """Cancel or time out a run from the engine or the reaper (inside a transaction)."""
    _close_run(run, target, reason, list(events or []), lease=lease, not_started=not_started)
