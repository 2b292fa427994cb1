"""One schedule: a scenario's run (or conversation) advanced by worker tasks, the reaper,
people and heartbeats, in the order a chooser picks; then brought to rest (every actor
let go, every message delivered, leases run out for the reaper, people deciding what
waits for them) and checked against the promise (invariants.py).

A move is a label and what it does; the moves at each step are listed in a fixed order,
so that a chooser's picks (by index) replay the same schedule. The fault phase lasts at
most `max_moves` moves; the moves of the rest phase follow from the state alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from django_agentrun import (
    approve_tool_call,
    cancel_run,
    reject_tool_call,
    resolve_tool_call,
    resume_run,
    start_run,
    webhooks,
)
from django_agentrun.abort import CANCEL_REQUESTED, LEASE_LOST, LEASE_UNRENEWED, AbortSignal
from django_agentrun.engine import advance
from django_agentrun.exceptions import AgentRunError
from django_agentrun.models import Run, ToolCall
from django_agentrun.reaper import reap
from django_agentrun.services import send_message, start_conversation, stop_conversation
from django_agentrun.states import RunState, ToolCallState

from . import world as w
from .controller import BLOCKED, CRASHED, PARKED, Actor, Controller

# Points where a worker late past its lease, whose run another holder took, is ended by its
# heartbeat before it goes on: the take-back is refused and the process ends itself before
# a tool's effect or a model request (docs/explanation/durability.md, "A late worker takes
# its lease back"; the one round trip that takes is not modelled).
BEFORE_EFFECT = ("tool.before_handler", "model.request")
# Points that add no interleaving: another point follows each with no I/O between (a
# commit's failpoint, then the next phase's first point), or it only reads (the reaper's
# candidates, locked and acted on at its take_lease point in the same transaction).
IGNORED = frozenset(
    {
        "claim.after_commit",
        "model.before_commit",
        "model.after_commit",
        "tool.after_commit",
        "store.lock_batch",
    }
)

TERMINAL = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT)
ACTIVE = (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING_TOOL, RunState.AWAITING_APPROVAL)


@dataclass(frozen=True)
class Scenario:
    """What a schedule starts with and what its people may do.

    `turns`: per answered turn, the tool uses the model asks for (then a final text);
    `people`: the commands a person may give (each at most once, when it applies);
    `conversation`: the run is a conversation's first message (people may message it);
    `raising_receiver`: an approval_requested receiver raises (an SMTP error);
    `webhooks`: a subscription to every event, its deliveries sent by a sender actor."""

    name: str
    turns: tuple[tuple[tuple[str, dict[str, Any]], ...], ...]
    people: tuple[str, ...] = ()
    conversation: bool = False
    raising_receiver: bool = False
    webhooks: bool = False


class Row:
    """A row of `World.snapshot`."""

    def __init__(
        self,
        pk: Any,
        state: str,
        lease_owner: str = "",
        cancel: bool = False,
        expired: bool = False,
    ) -> None:
        self.pk, self.state, self.lease_owner = pk, state, lease_owner
        self.cancel, self.expired = cancel, bool(expired)

    @property
    def flags(self) -> str:
        return (
            self.state
            + ("+leased" if self.lease_owner else "")
            + ("+cancel" if self.cancel else "")
        )


@dataclass
class Move:
    label: str
    kind: str  # go, deliver, reap, person, fault, end
    do: Callable[[], None]
    # What the move does where: the coverage a guided chooser counts (None: the default go).
    key: tuple[Any, ...] | None = None


@dataclass
class Budget:
    faults: int = 3
    reaps: int = 3
    duplicates: int = 1


@dataclass
class Result:
    scenario: str
    steps: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    picks: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class World:
    """The state of one schedule (see the module's docstring)."""

    def __init__(self, scenario: Scenario, chooser: Any, *, max_moves: int = 60) -> None:
        self.scenario = scenario
        self.chooser = chooser
        self.max_moves = max_moves
        self.controller = Controller(ignored=IGNORED)
        self.broker = w.Broker()
        self.slots = [w.Slot("W1"), w.Slot("W2")]
        self.truth = w.TRUTH = w.Truth()
        self.budget = Budget()
        self.people_done: set[str] = set()
        self.dead_owners: set[str] = set()
        self.late: set[Actor] = set()
        self.run_id: Any = None
        self.conversation_id: Any = None
        self.result = Result(scenario.name)
        self.ids = itertools.count(1)
        self.last: Actor | None = None
        self.hooks: list[str] = []  # the deliveries handed to a sender, not yet taken

    # -- the model's answers ------------------------------------------------------------

    def answer(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The scripted answer: by the number of assistant messages since the last
        message of the person's (a text input, not tool results)."""
        step = 0
        for message in reversed(messages):
            if message["role"] == "assistant":
                step += 1
                continue
            content = message["content"]
            if isinstance(content, str) or any(b.get("type") != "tool_result" for b in content):
                break
        if step < len(self.scenario.turns):
            return [
                {"type": "tool_use", "id": f"toolu_x{next(self.ids):021d}", "name": n, "input": a}
                for n, a in self.scenario.turns[step]
            ]
        return [{"type": "text", "text": f"done ({step} steps)"}]

    # -- runs -----------------------------------------------------------------------------

    def runs(self) -> list[Run]:
        if self.conversation_id is not None:
            return list(
                Run.objects.filter(conversation_id=self.conversation_id).order_by(
                    "conversation_position"
                )
            )
        return list(Run.objects.filter(pk=self.run_id))

    def run_ids(self) -> list[Any]:
        return [r.pk for r in self.snapshot()[0]]

    def snapshot(self) -> tuple[list[Any], list[Any]]:
        """The runs (pk, state, lease_owner) and their calls (pk, state), read in two plain
        statements: what the moves of a step depend on."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, state, lease_owner, cancel_requested_at IS NOT NULL,"
                " lease_expires_at < statement_timestamp() FROM agentrun_run"
                " WHERE id = %s OR conversation_id = %s"
                " ORDER BY conversation_position NULLS FIRST, id",
                [self.run_id, self.conversation_id],
            )
            runs = [Row(*r) for r in cursor.fetchall()]
            cursor.execute(
                "SELECT id, state FROM agentrun_toolcall WHERE run_id = ANY(%s) ORDER BY id",
                [[r.pk for r in runs]],
            )
            calls = [Row(pk, state) for pk, state in cursor.fetchall()]
        return runs, calls

    def start(self) -> None:
        if self.scenario.conversation:
            conversation = start_conversation(w.AGENT)
            self.conversation_id = conversation.pk
            self.run_id = send_message(conversation, "begin").pk
        else:
            self.run_id = start_run(w.AGENT, "begin").pk

    # -- actors ---------------------------------------------------------------------------

    def _task(self, slot: w.Slot, message: w.Message) -> Callable[[Actor], Any]:
        def task(actor: Actor) -> Any:
            w.CURRENT.set(actor)
            outcome = advance(
                message.run_id,
                owner=slot.owner,
                abort=AbortSignal(),
                client=self.client,
                heartbeat=True,
            )
            self.controller.point("task.end")  # a crash here: the message is not acknowledged
            self.broker.ack(message)
            return outcome

        return task

    def deliver(self, slot: w.Slot, index: int = 0) -> None:
        message = self.broker.take(index, slot)
        slot.task = self.controller.spawn(slot.name, "worker", self._task(slot, message))
        slot.task.slot = (slot, message)

    def spawn_reaper(self) -> None:
        def reaper(actor: Actor) -> Any:
            w.CURRENT.set(actor)
            found = reap(run_ids=self.run_ids(), stale_after=0)
            if self.scenario.webhooks:
                self.controller.point("webhook.sweep")
                webhooks.sweep()
            return found

        self.controller.spawn("reaper", "reaper", reaper)

    def send_hook(self) -> None:
        """A worker takes a delivery from the queue and tries it (webhooks.deliver)."""
        delivery_id = self.hooks.pop(0)

        def sender(actor: Actor) -> Any:
            w.CURRENT.set(actor)
            return webhooks.deliver(delivery_id)

        self.controller.spawn("sender", "sender", sender)

    def hold_runs_out(self) -> None:
        """Time passes: the hold of every delivery being tried runs out."""

        def run_out(actor: Actor) -> Any:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE agentrun_webhookdelivery SET locked_until = statement_timestamp()"
                    " - interval '1 second' WHERE locked_until IS NOT NULL"
                )

        clock = self.controller.spawn("clock", "clock", run_out)
        while clock.status == PARKED:
            self.controller.grant(clock)

    def person(self, label: str, command: Callable[[], Any]) -> None:
        def act(actor: Actor) -> Any:
            w.CURRENT.set(actor)
            try:
                return command()
            except AgentRunError as exc:  # refused as the API would answer it (4xx)
                return exc

        self.controller.spawn(label, "person", act)

    # -- the heartbeat, as moves -----------------------------------------------------------

    def beat(self, target: Actor) -> None:
        """One renewal of `target`'s lease (a compare-and-set on its epoch: it also takes
        back a lease that ran out, if nobody else took the run)."""
        lease, abort = target.lease, target.abort

        def renew(actor: Actor) -> Any:
            from django_agentrun import store

            return store.renew_lease(lease)

        hb = self.controller.spawn(f"beat-{target.name}", "heartbeat", renew)
        while hb.status == PARKED:
            self.controller.grant(hb)
        if hb.error is not None or hb.result is None:
            return
        held, cancel = hb.result
        if held:
            self.late.discard(target)
            if cancel and abort is not None:
                abort.abort(CANCEL_REQUESTED)
        elif abort is not None:
            abort.abort(LEASE_LOST)
            if target in self.late and target.alive:
                self.crash(target, "child")  # lapsed: the process ends itself at once

    def expire(self, run_id: Any) -> None:
        """Time passes: the run's lease runs out (its holder, if alive, is late)."""

        def run_out(actor: Actor) -> Any:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE agentrun_run SET lease_expires_at = statement_timestamp()"
                    " - interval '1 second' WHERE id = %s AND lease_owner <> ''"
                    " RETURNING lease_owner, lease_epoch",
                    [run_id],
                )
                return cursor.fetchone()

        clock = self.controller.spawn("clock", "clock", run_out)
        while clock.status == PARKED:
            self.controller.grant(clock)
        for actor in self.controller.busy():
            if actor.lease is not None and str(actor.lease.run_id) == str(run_id):
                self.late.add(actor)

    def crash(self, actor: Actor, kind: str) -> None:
        """The actor's process dies: a pool child ("child": provably dead to a worker on its
        machine, its message redelivered) or a whole worker or host ("host": its lease
        must run out, its message is lost until a visibility timeout)."""
        self.controller.crash(actor)
        self.late.discard(actor)
        if actor.slot is not None:
            slot, message = actor.slot
            if slot.task is actor and message.generation == slot.generation:
                if kind == "child":
                    self.dead_owners.add(slot.owner)
                slot.generation += 1
                self.broker.worker_lost(message, redelivered=kind == "child")

    def go(self, actor: Actor) -> None:
        """Let an actor go; a late worker whose run another holder took is ended by its
        heartbeat first where it would start an effect."""
        if actor in self.late and actor.lease is not None:
            owner, epoch = (
                Run.objects.filter(pk=actor.lease.run_id)
                .values_list("lease_owner", "lease_epoch")
                .first()
            )
            if (owner, epoch) == (actor.lease.owner, actor.lease.epoch):
                self.beat(actor)  # taken back: nobody took the run meanwhile
            elif actor.point.partition("@")[0] in BEFORE_EFFECT:
                self.crash(actor, "child")
                return
        self.last = actor
        self.controller.grant(actor)

    # -- the moves --------------------------------------------------------------------------

    def where(self, actor: Actor) -> str:
        late = " (late)" if actor in self.late else ""
        return f"{actor.kind}@{actor.point}{late}"

    def moves(self, faults: bool = True) -> list[Move]:
        """This step's moves, the default first: an actor that has not moved yet (a person's
        command, a reaper pass: people and the reaper act at once unless the schedule says
        otherwise), else the actor that moved last goes on, else the one that started
        first, else a delivery; then the others. Each but the default carries its coverage
        key: what it does, where every parked actor is, and the runs' and calls' states.
        Moves that would change nothing are not offered (a reaper pass with nothing to
        find, a heartbeat with nothing to notice)."""
        parked = self.controller.parked()
        runs, calls = self.snapshot() if faults else ([], [])
        context = (
            tuple(sorted(self.where(a) for a in parked)),
            tuple(r.flags for r in runs),
            tuple(c.state for c in calls),
        )
        fresh = [a for a in parked if a.points == 1]
        default = (
            fresh[-1]
            if fresh
            else self.last
            if self.last in parked
            else (parked[0] if parked else None)
        )
        found: list[Move] = []
        for actor in sorted(parked, key=lambda a: a is not default):
            key = None if actor is default else ("go", self.where(actor), context)
            found.append(
                Move(f"go {actor.name} ({actor.point})", "go", lambda a=actor: self.go(a), key)
            )
        idle = next((slot for slot in self.slots if slot.idle), None)
        if idle is not None and self.broker.queue:
            key = None if not found else ("deliver", context)
            found.append(
                Move(f"deliver to {idle.name}", "deliver", lambda s=idle: self.deliver(s), key)
            )
        if self.hooks:
            key = None if not found else ("send a webhook", context)
            found.append(Move("send a webhook", "deliver", self.send_hook, key))
        if not faults:
            return found
        optional: list[Move] = []
        if self.budget.reaps and self._reapable(runs):
            optional.append(Move("reap", "reap", self._reap, ("reap",)))
        optional.extend(self._people(runs, calls))
        if self.budget.faults:
            optional.extend(self._faults(runs))
        for move in optional:
            move.key = (*(move.key or (move.label,)), context)
        return found + optional

    def _reapable(self, runs: list[Row]) -> bool:
        """Whether a reaper pass would find anything (and none is under way)."""
        if any(a.kind == "reaper" for a in self.controller.busy()):
            return False
        if self.scenario.webhooks:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM agentrun_webhookdelivery WHERE status = 'pending' AND"
                    " (locked_until IS NULL OR locked_until < statement_timestamp()) LIMIT 1"
                )
                if cursor.fetchone():
                    return True  # its sweep hands them to a sender again
        held = self.broker.held()
        for run in runs:
            if run.lease_owner and run.expired and run.state in ACTIVE:
                return True
            if run.state == RunState.AWAITING_APPROVAL and run.cancel:
                return True
            if run.state in ACTIVE[:3] and not run.lease_owner and str(run.pk) not in held:
                return True
        return False

    def _reap(self) -> None:
        self.budget.reaps -= 1
        self.spawn_reaper()

    def _faults(self, runs: list[Row]) -> list[Move]:
        found: list[Move] = []

        def fault(label: str, key: tuple[Any, ...], do: Callable[[], None]) -> None:
            def spend() -> None:
                self.budget.faults -= 1
                do()

            found.append(Move(label, "fault", spend, key))

        holders = [a for a in self.controller.busy() if a.lease is not None]
        rows = {str(r.pk): r for r in runs}
        for actor in holders:
            row = rows.get(str(actor.lease.run_id))
            if row is None or actor.abort is None:
                continue
            noticed = actor.abort.cancel_requested or not row.cancel
            if noticed and actor not in self.late and row.lease_owner == actor.lease.owner:
                continue  # it would renew and notice nothing
            found.append(
                Move(
                    f"beat {actor.name}",
                    "fault",
                    lambda a=actor: self.beat(a),
                    ("beat", self.where(actor)),
                )
            )
        for run in (r for r in runs if r.lease_owner):
            fault(
                f"lease of {str(run.pk)[:8]} runs out", ("expire",), lambda r=run.pk: self.expire(r)
            )
        for actor in holders:
            if actor.abort is not None and not actor.abort.aborted:
                fault(
                    f"watchdog stops {actor.name}",
                    ("watchdog", self.where(actor)),
                    lambda a=actor: a.abort.abort(LEASE_UNRENEWED),
                )
        for actor in self.controller.busy():
            if actor.kind in ("worker", "reaper", "sender") and actor.status in (PARKED, BLOCKED):
                for kind in ("child", "host"):
                    fault(
                        f"crash {actor.name} ({kind})",
                        (f"crash {kind}", self.where(actor)),
                        lambda a=actor, k=kind: self.crash(a, k),
                    )
        senders = [a for a in self.controller.busy() if a.kind == "sender"]
        if any(a.status == CRASHED for a in self.controller.actors if a.kind == "sender") and all(
            a.point == "start" for a in senders
        ):
            # A live try ends within its hold (webhooks.deliver bounds it by the timeout):
            # the hold that runs out is a dead sender's.
            fault("a webhook's hold runs out", ("hold",), self.hold_runs_out)
        if self.budget.duplicates and self.hooks:

            def twice() -> None:
                self.budget.duplicates -= 1
                self.hooks.append(self.hooks[0])

            fault("a webhook handed over twice", ("duplicate hook",), twice)
        if self.budget.duplicates and self.broker.queue:

            def duplicate() -> None:
                self.budget.duplicates -= 1
                self.broker.apply_async(args=[self.broker.queue[0].run_id])

            fault("a message delivered twice", ("duplicate",), duplicate)
        return found

    def _people(self, runs: list[Row], calls: list[Row]) -> list[Move]:
        found: list[Move] = []
        last = runs[-1] if runs else None

        def offer(label: str, command: Callable[[], Any]) -> None:
            if label in self.people_done:
                return

            def do() -> None:
                self.people_done.add(label)
                self.person(label, command)

            found.append(Move(f"person: {label}", "person", do, ("person", label)))

        for intent in self.scenario.people:
            if intent == "cancel" and last is not None and last.state in ACTIVE:
                offer("cancel", lambda r=last.pk: cancel_run(r, reason="person cancels"))
            elif intent == "resume" and last is not None and last.state in TERMINAL[1:]:
                offer("resume", lambda r=last.pk: resume_run(r))
            elif intent in ("approve", "reject"):
                for call in calls:
                    if call.state == ToolCallState.AWAITING_APPROVAL:
                        if intent == "approve":
                            offer("approve", lambda c=call.pk: approve_tool_call(c, by=None))
                        else:
                            offer(
                                "reject",
                                lambda c=call.pk: reject_tool_call(c, by=None, reason="no"),
                            )
            elif intent.startswith("message:") and self.conversation_id is not None:
                policy = intent.partition(":")[2]
                offer(
                    intent,
                    lambda p=policy: send_message(self.conversation_id, f"more ({p})", policy=p),
                )
            elif intent == "stop" and self.conversation_id is not None:
                offer("stop", lambda: stop_conversation(self.conversation_id))
        return found

    # -- the schedule -----------------------------------------------------------------------

    def run(self) -> Result:
        from . import invariants

        self.start()
        for step in range(self.max_moves):
            moves = self.moves()
            if not moves:
                break
            optional = not any(m.kind in ("go", "deliver") for m in moves)
            if optional:
                moves = [Move("end of faults", "end", lambda: None), *moves]
            move = moves[self.chooser.choose(step, moves)]
            self.result.steps.append(move.label)
            if move.kind == "end":
                break
            move.do()
            invariants.during(self)
            if self.truth.violations:
                break
        if not self.truth.violations:
            self.rest()
            invariants.after(self)
        self.result.violations = list(self.truth.violations)
        self.controller.release_crashed()
        return self.result

    def rest(self) -> None:
        """Bring every run to rest without faults: let every actor go, deliver every
        message; when nothing moves, let leases run out and the reaper find what is left
        (a requested cancel must be applied by then), and people decide what waits for them."""
        from . import invariants

        idle_passes = 0
        for _ in range(400):
            parked = self.controller.parked()
            if parked:
                self.result.steps.append(f"rest: go {parked[0].name} ({parked[0].point})")
                self.go(parked[0])
                continue
            moves = self.moves(faults=False)
            if moves:
                self.result.steps.append(f"rest: {moves[0].label}")
                moves[0].do()
                continue
            runs = self.runs()
            for run in runs:
                if run.state in ACTIVE and run.lease_owner:
                    self.expire(run.pk)
            if self.scenario.webhooks:
                self.hold_runs_out()  # a dead sender's delivery: the reaper's sweep finds it
            self.result.steps.append("rest: reap")
            self.spawn_reaper()
            reaper = self.controller.actors[-1]
            while reaper.status == PARKED:
                self.go(reaper)
            if reaper.result is not None and reaper.result.findings:
                idle_passes = 0
                continue
            idle_passes += 1
            if self.broker.queue or self.hooks or self.controller.parked():
                continue
            invariants.at_rest(self, runs)
            if self.truth.violations:
                return
            if self._decide(runs):
                continue
            if all(r.state in TERMINAL for r in runs) or idle_passes > 3:
                if not all(r.state in TERMINAL for r in runs):
                    stuck = [(str(r.pk)[:8], r.state) for r in runs if r.state not in TERMINAL]
                    self.truth.violated(f"runs never came to rest: {stuck}")
                return
        self.truth.violated("the rest phase did not end in 400 moves")

    def _decide(self, runs: list[Run]) -> bool:
        """People decide what waits for them: approve what asks, fail what is unknown."""
        calls = ToolCall.objects.filter(run_id__in=[r.pk for r in runs])
        waiting = calls.filter(state__in=(ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN))
        for call in waiting.order_by("pk"):
            if call.state == ToolCallState.AWAITING_APPROVAL:
                command: Callable[[], Any] = lambda c=call.pk: approve_tool_call(c, by=None)  # noqa: E731
            else:
                command = lambda c=call.pk: resolve_tool_call(c, by=None, action="fail")  # noqa: E731
            self.result.steps.append(f"rest: person decides {call.tool_call_id[-6:]}")
            self.person("decide", command)
            return True
        return False

    # -- the model client -------------------------------------------------------------------

    @property
    def client(self) -> Any:
        from .model import ExplorerClient

        return ExplorerClient(self)


def crashed(actor: Actor) -> bool:
    return actor.status == CRASHED
