"""A unit of work: one durable step's writes, committed together.

Writes are collected, not sent: a turn's or tool call's update and a new row's insert
wait for the run write that follows them, and the run write waits for the unit's end.
So the unit knows, before it sends anything, whether its run write is alone:

- alone (Postgres, autocommit, nothing else happened in the unit): the run write and the
  rows it carries are one statement sent in autocommit mode, one round trip instead of
  BEGIN, statement, COMMIT; still all or nothing (store.runs: gates and the fence);
- otherwise (a second run write, a row write after it, any other statement, such as a
  read) a transaction is begun first, and everything is sent in program order inside it.

Elsewhere (SQLite, inside a caller's transaction, AUTOCOMMIT=False, or `atomic=True` for
a step that locks rows first) the unit is a `transaction.atomic()` and each run write is
sent when it is made. On-commit callbacks (enqueue, signals) run after the unit commits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import connection, transaction

from ..models import Run
from .rows import Deferred, RowInsert, RowUpdate
from .runs import Event, Lease, RunWrite


class Unit:
    """Build a step's writes: `update`, `insert`, `write_run`, `on_commit`. After the
    unit, `cancel_requested` tells whether a run write saw a cancel request."""

    def __init__(self, stack: ExitStack, *, lazy: bool) -> None:
        self._stack = stack
        self._lazy = lazy
        self._open = not lazy  # a transaction is open (an atomic unit is one from the start)
        self._sending_alone = False
        self._rows: list[Deferred] = []
        self._held: RunWrite | None = None
        self._callbacks: list[Callable[[], Any]] = []
        self._events: list[Event] = []
        self.cancel_requested = False

    # -- building ------------------------------------------------------------------------

    def update(self, obj: Any, old_state: str | None = None, **fields: Any) -> None:
        """Compare-and-set `obj`'s `fields` (and its state from memory, expected to still be
        `old_state`); sent with the next run write. `obj` takes the values at once."""
        self._release_held()
        if obj.pk is None:  # its insert is still pending
            self.flush()
        model = type(obj)
        if any(
            isinstance(u, RowUpdate) and u.model is model and u.pk == obj.pk for u in self._rows
        ):
            # The parts of one statement share a snapshot: a second update of the same row
            # must see the first, so what is pending goes first.
            self.flush()
        self._rows.append(RowUpdate.build(obj, old_state, fields))

    def insert(self, objs: list[Any]) -> None:
        """Insert new turns or tool calls (one statement); their ids are set when it is sent."""
        if objs:
            self._release_held()
            self._rows.append(RowInsert.build(objs))

    @property
    def recorded(self) -> bool:
        """Events wait for a run write."""
        return bool(self._events)

    def record(self, event: Event) -> None:
        """An event of this step; it goes with the next run write (which gives it its seq)."""
        self._events.append(event)

    def write_run(
        self,
        run: Run,
        events: list[Event] | None = None,
        *,
        lease: Lease | None = None,
        old_state: str | None = None,
        fields: dict[str, Any] | None = None,
        incr: dict[str, Any] | None = None,
    ) -> None:
        """The run's compare-and-set write (fenced by `lease`) with the events recorded since
        the last one (then `events`) and the rows written before it. Refused as a whole
        with LeaseLost or ConcurrentUpdate."""
        self._release_held()
        events = [*self._events, *(events or [])]
        write = RunWrite(run, events, lease, old_state, fields or {}, incr or {}, self._rows)
        self._rows, self._events = [], []
        if self._lazy and not self._open:
            self._held = write
        else:
            self.cancel_requested |= write.send()

    def on_commit(self, callback: Callable[[], Any]) -> None:
        if self._lazy:
            self._callbacks.append(callback)
        else:
            transaction.on_commit(callback)

    def flush(self) -> None:
        """Send the pending row writes now (beginning the transaction first)."""
        if self._rows:
            self._begin()
            rows, self._rows = self._rows, []
            for row in rows:
                row.send()

    # -- sending -------------------------------------------------------------------------

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        """connection.execute_wrapper: every statement but the lone run write goes inside
        the unit's transaction, after what the unit wrote before it."""
        if not self._open and not self._sending_alone:
            self._begin()
            self._release_held()
            self.flush()
        return execute(sql, params, many, context)

    def _begin(self) -> None:
        if self._open:
            return
        if connection.in_atomic_block:
            raise RuntimeError("transaction.atomic() was entered inside a unit before its writes")
        self._stack.enter_context(transaction.atomic())
        self._open = True

    def _release_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._begin()
            self.cancel_requested |= held.send()

    def _finish(self) -> None:
        if self._events:
            raise RuntimeError(f"events recorded without a run write: {self._events}")
        held, self._held = self._held, None
        if held is not None and not self._open:
            self._sending_alone = True
            self.cancel_requested |= held.send(alone=True)
            return
        if held is not None:
            self.cancel_requested |= held.send()
        self.flush()


@contextmanager
def unit(*, atomic: bool = False) -> Iterator[Unit]:
    """A unit of work (see the module's docstring); `atomic=True` for one that reads and
    locks rows before it writes."""
    lazy = (
        not atomic
        and connection.vendor == "postgresql"
        and not connection.in_atomic_block
        and connection.get_autocommit()  # AUTOCOMMIT=False: Django never commits alone
    )
    with ExitStack() as stack:
        if not lazy:
            stack.enter_context(transaction.atomic())
        work = Unit(stack, lazy=lazy)
        if lazy:
            stack.enter_context(connection.execute_wrapper(work))
        yield work
        work._finish()
    for callback in work._callbacks:  # committed
        callback()
