"""A write: what one commit changes, built by the transitions and sent by `send`
(backend.py) as a whole.

- the run's compare-and-set change: its new column values, counters to add to, the
  state it is expected to be in, and the lease that fences it;
- the turns and tool calls it adds, and those it changes (each expected in the state it
  was read in);
- its events (their seqs come from the run's `last_seq`), and what to do after the commit.

How a write is sent is the store's implementation's (postgres.py: one statement;
portable.py: a few ORM statements in one transaction); what both do once it is sent
(`settle`), and the refusal both raise (`refused`: LeaseLost or ConcurrentUpdate), are here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, NoReturn

from django.db import transaction
from django.utils import timezone

from .. import streams
from ..events import EventType
from ..exceptions import ConcurrentUpdate, LeaseLost
from ..models import Run, ToolCall, Turn
from ..models.recorded import Recorded

Event = tuple[str, dict[str, Any]]

LeaseChange = Literal["keep", "now", "renew"]

# A cap (store/caps.py): the column it counts by ("agent" or "share_key"), its value, the cap.
Share = tuple[str, str, int]


@dataclass(frozen=True)
class Lease:
    """Proof that this worker may advance the run: its owner string and the epoch it
    claimed. `valid_until` (time.monotonic()) is when it runs out at the latest, taken
    before the claim was sent: the holder must stop executing before then unless renewed."""

    run_id: uuid.UUID
    owner: str
    epoch: int
    valid_until: float = float("inf")


@dataclass
class Change:
    """One turn or tool call to change: `obj` already holds the new values."""

    obj: Any
    expected: str | None
    fields: dict[str, Any]


@dataclass
class Write:
    """What one commit changes (see the module's docstring). Built by transitions.py."""

    run: Run
    lease: Lease | None = None
    expected_state: str | None = None
    run_fields: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    lease_change: LeaseChange = "keep"
    added: list[Any] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    after_commit: list[Callable[[], Any]] = field(default_factory=list)
    # What wakes the run's live-stream readers after a commit with events (streams.notify),
    # None without live streams: looked up when the write is made, unless its maker knows.
    nudge: Callable[[Any, int], Any] | None = field(default_factory=lambda: _nudge())
    # What the commit answered:
    cancel_requested: bool = False

    # -- building (transitions.py) --------------------------------------------------------

    def set_run(self, **fields: Any) -> None:
        """New values of run columns (the instance takes them once the write is sent)."""
        self.run_fields.update(fields)

    def expect_run(self, state: str) -> None:
        """The run must still be in `state` (the first expectation of a write holds)."""
        if self.expected_state is None:
            self.expected_state = state

    def count(self, **deltas: Any) -> None:
        """Add to the run's counters (usage, cost, turns)."""
        for name, delta in deltas.items():
            self.counters[name] = self.counters.get(name, 0) + delta

    def add(self, *objs: Any) -> None:
        """New turns or tool calls (their ids are set when the write is sent)."""
        self.added.extend(objs)

    def change(self, obj: Any, expected: str | None, **fields: Any) -> None:
        """Set `fields` on a turn or tool call (it takes them at once), expected to be in
        state `expected` in the database; one added in this write is simply written as is."""
        for name, value in fields.items():
            if name != "state":  # moved already (transitions), and protected
                setattr(obj, name, value)
        if any(obj is added for added in self.added):
            return
        for existing in self.changed:
            if existing.obj is obj:
                existing.fields.update(fields)
                return
        self.changed.append(Change(obj, expected, dict(fields)))

    def record(self, event: Event) -> None:
        self.events.append(event)

    def then(self, callback: Callable[[], Any]) -> None:
        """Run `callback` after the commit (a wake-up, a signal); never if it is refused."""
        self.after_commit.append(callback)


@dataclass(frozen=True)
class Placed:
    """A recorded value (models/recorded.py) one of a write's events holds: the row takes
    the seq of the event at `place` (0 for the first of the write's) instead of a copy."""

    obj: Any
    spec: Recorded
    place: int


def placed(objs: Iterable[Any], events: list[Event]) -> list[Placed]:
    """The recorded values of `objs` that `events` hold: for each, the last event that
    describes the object and holds its value as it is now."""
    out = []
    for obj in objs:
        for spec in getattr(obj, "RECORDED", ()):
            value = getattr(obj, spec.attr)
            if value is None:
                continue
            for place in range(len(events) - 1, -1, -1):
                kind, payload = events[place]
                if _describes(obj, kind, payload) and payload.get(spec.key) == value:
                    out.append(Placed(obj, spec, place))
                    break
    return out


def placed_in(write: Write) -> list[Placed]:
    """`placed` for a write: the objects it adds, and those whose recorded value it sets."""
    if not write.events:
        return []
    changed = [
        c.obj
        for c in write.changed
        if any(s.attr in c.fields for s in getattr(c.obj, "RECORDED", ()))
    ]
    return placed([*write.added, *changed], write.events)


def _describes(obj: Any, kind: str, payload: dict[str, Any]) -> bool:
    """The event records `obj`'s value: a turn's answer (not one discarded), a call's
    result (its closing, a person's decision that closes it, a replacement)."""
    if isinstance(obj, Turn):
        return (
            kind == EventType.MODEL_RESPONSE
            and payload.get("turn_index") == obj.index
            and not payload.get("discarded")
        )
    if isinstance(obj, ToolCall):
        return (
            "result" in payload
            and payload.get("tool_call_id") == obj.tool_call_id
            and payload.get("turn_index") == obj.turn_index
        )
    return False


def _nudge() -> Callable[[Any, int], Any] | None:
    return streams.notify if streams.publisher() is not None else None


# -- after sending -----------------------------------------------------------------------


def settle(
    write: Write, last_seq: int, cancel_requested: bool, placed: Iterable[Placed] = ()
) -> None:
    """The run instance takes what was written (the write was sent), the rows of recorded
    values the seqs of the events that hold them."""
    run = write.run
    first = last_seq - len(write.events) + 1
    for p in placed:
        setattr(p.obj, p.spec.seq_field, first + p.place)
    run.last_seq = last_seq
    for name, value in write.run_fields.items():
        if name != "state":
            setattr(run, name, value)
    for name, delta in write.counters.items():
        setattr(run, name, getattr(run, name) + delta)
    if write.lease_change == "now":
        run.lease_expires_at = timezone.now()
    write.cancel_requested = cancel_requested


def sent(write: Write) -> None:
    """What follows a write sent (by either store): its callbacks, and the nudge to the run's
    stream readers, after the commit (at once when it was its own transaction, else when the
    caller's commits). Robustly: one that raises is logged (by Django) and the others still
    run, and the committed change is not turned into an error."""
    for callback in write.after_commit:
        transaction.on_commit(callback, robust=True)
    if write.events and write.nudge is not None:
        transaction.on_commit(partial(write.nudge, write.run, write.run.last_seq), robust=True)


def refused(write: Write) -> NoReturn:
    """Say which refusal a write met: LeaseLost, or ConcurrentUpdate."""
    run, lease, expected = write.run, write.lease, write.expected_state
    current = Run.objects.filter(pk=run.pk).values("state", "lease_epoch", "lease_owner").first()
    if current is None:
        raise ConcurrentUpdate(f"Run {run.pk} no longer exists")
    if lease is not None and (
        current["lease_epoch"] != lease.epoch or current["lease_owner"] != lease.owner
    ):
        raise LeaseLost(f"Run {run.pk}: lease epoch {lease.epoch} was superseded")
    if expected is None or current["state"] == expected:
        raise ConcurrentUpdate(f"Run {run.pk}: one of its turns or tool calls changed concurrently")
    raise ConcurrentUpdate(
        f"Run {run.pk} changed concurrently: expected state {expected!r}, found {current['state']!r}"
    )
