"""What the explorer's actors act on, besides the real store on Postgres: a broker that
holds advance_run messages as Celery on Redis would (late acks: a message is taken by a
worker and acknowledged when its task ends; a pool child killed returns it to the queue,
a whole worker lost keeps it unacknowledged until a visibility timeout nobody waits for),
worker slots (a worker process: one task at a time, an identity per process), a heartbeat
that acts only when the schedule says, the ground truth of what the tools did, and the
agents and tools the scenarios run.

Time is the schedule's: a lease runs out only when a move says so (the database's clock is
never waited for), and the reaper counts any unclaimed run as stale (`stale_after=0`) but
asks this broker which wake-ups it still holds.
"""

from __future__ import annotations

import contextvars
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from django_agentrun import Agent, Reconciliation, SideEffect, ToolContext, store, tool

from .controller import Actor

# The actor whose work a tool's effect belongs to (a batch's pool threads inherit it:
# the engine runs them in a copy of the actor thread's context).
CURRENT: contextvars.ContextVar[Actor | None] = contextvars.ContextVar(
    "explorer_actor", default=None
)


@dataclass
class Message:
    id: int
    run_id: str
    taken_by: Slot | None = None
    generation: int = 0  # of the worker process that took it


class Broker:
    """advance_run's queue (FIFO) and the messages workers took and have not acknowledged."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.queue: list[Message] = []
        self.unacked: list[Message] = []

    def apply_async(self, args: Any = (), **options: Any) -> None:
        """What wakeups.send calls (the registered task): a message at the queue's end (a
        countdown is not waited for: a wake-up early is one more claim, never a wrong one)."""
        self.queue.append(Message(next(self.ids), str(args[0])))

    def take(self, index: int, slot: Slot) -> Message:
        message = self.queue.pop(index)
        message.taken_by, message.generation = slot, slot.generation
        self.unacked.append(message)
        return message

    def ack(self, message: Message) -> None:
        if message in self.unacked:
            self.unacked.remove(message)

    def worker_lost(self, message: Message, redelivered: bool) -> None:
        """The worker holding `message` died: a pool child's message is redelivered
        (task_reject_on_worker_lost); a whole worker's stays unacknowledged (lost)."""
        if redelivered and message in self.unacked:
            self.unacked.remove(message)
            message.taken_by = None
            self.queue.append(message)

    def held(self) -> set[str]:
        """The runs whose wake-up this broker holds (wakeups.waiting_runs): queued, or
        taken by a worker that is alive."""
        found = {m.run_id for m in self.queue}
        found |= {
            m.run_id
            for m in self.unacked
            if m.taken_by is not None and m.taken_by.generation == m.generation
        }
        return found


@dataclass(eq=False)
class Slot:
    """A worker process: one task at a time; a new process (a new identity) after a crash."""

    name: str
    generation: int = 1
    task: Actor | None = None

    @property
    def owner(self) -> str:
        return f"explorer:{self.name}:{self.generation}"

    @property
    def idle(self) -> bool:
        return self.task is None or not self.task.alive


class FakeBeat:
    """The heartbeat under the explorer (driver.Heartbeat): it only tells the schedule which
    lease and abort signal the actor's step holds; renewals, cancel polls and the watchdog
    are moves of the schedule (World.heartbeat, World.watchdog)."""

    def __init__(self, lease: Any, abort: Any) -> None:
        self.lease = lease
        self.actor = CURRENT.get()
        if self.actor is not None:
            self.actor.lease, self.actor.abort = lease, abort

    def start(self) -> None:
        pass

    def stop(self) -> None:
        if self.actor is not None:
            self.actor.lease = None

    def give_up(self) -> bool:
        """Heartbeat.give_up: the beat stops (the schedule renews this actor's lease no
        more), then the lease runs out, its epoch moved on."""
        self.stop()
        return store.expire_lease(self.lease)


@dataclass
class Truth:
    """What happened outside the database: each tool's effects and returned results, the
    model's answers to recorded turns, and the invariants' violations."""

    effects: dict[tuple[str, str], list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    returned: dict[tuple[str, str], list[Actor]] = field(default_factory=lambda: defaultdict(list))
    asked: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    sending: dict[str, set[Actor]] = field(default_factory=dict)  # webhook id: senders
    sent: Counter = field(default_factory=Counter)  # webhook id: requests sent

    def effect(self, ctx: ToolContext, name: str) -> None:
        actor = CURRENT.get()
        self.effects[str(ctx.run_id), ctx.tool_call_id].append(
            {
                "tool": name,
                "attempt": ctx.attempt,
                "key": ctx.idempotency_key,
                "actor": actor.name if actor else "?",
            }
        )

    def returns(self, ctx: ToolContext) -> None:
        actor = CURRENT.get()
        if actor is not None:
            self.returned[str(ctx.run_id), ctx.tool_call_id].append(actor)

    def violated(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)


TRUTH = Truth()  # replaced by each schedule (World.__init__)


def _ran(ctx: ToolContext, name: str, value: str) -> str:
    TRUTH.effect(ctx, name)
    TRUTH.returns(ctx)
    return value


# -- the scenarios' tools --------------------------------------------------------------


def _paid(ctx: ToolContext, amount: int) -> Reconciliation:
    """An honest check: it sees the effect if there was one."""
    if TRUTH.effects.get((str(ctx.run_id), ctx.tool_call_id)):
        return Reconciliation.done(f"paid {amount}")
    return Reconciliation.not_done()


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=_paid)
def x_pay(ctx: ToolContext, amount: int) -> str:
    """Pay (non-idempotent, with an honest reconcile check)."""
    return _ran(ctx, "x_pay", f"paid {amount}")


@tool(side_effect=SideEffect.NON_IDEMPOTENT)
def x_charge(ctx: ToolContext, amount: int) -> str:
    """Charge a card (non-idempotent, no check: a person settles an unknown outcome)."""
    return _ran(ctx, "x_charge", f"charged {amount}")


@tool(side_effect=SideEffect.NON_IDEMPOTENT, requires_approval=True)
def x_refund(ctx: ToolContext, order: str) -> str:
    """Refund an order (non-idempotent, approved by a person first)."""
    return _ran(ctx, "x_refund", f"refunded {order}")


@tool(side_effect=SideEffect.READ_ONLY)
def x_look(ctx: ToolContext, q: str) -> str:
    """Look something up (read-only; heartbeats its call, touching the ORM)."""
    ctx.heartbeat()
    return _ran(ctx, "x_look", f"found {q}")


@tool(side_effect=SideEffect.IDEMPOTENT_WRITE)
def x_note(ctx: ToolContext, text: str) -> str:
    """Save a note (idempotent by its key)."""
    return _ran(ctx, "x_note", f"noted {text}")


TOOLS = [x_pay, x_charge, x_refund, x_look, x_note]
AGENT = "explorer"


def define_agent() -> Agent:
    """The scenarios' agent (registered by the explorer's fixture, forgotten after it)."""
    return Agent(name=AGENT, tools=TOOLS, max_turns=6)
