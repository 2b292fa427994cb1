"""What one advance of a run knows (`Step`), and the value each of its phases ends with
(`Commit`: a write, and what follows it) for the driver to send.

The other modules of the engine are the phases: claim.py decides at the claim,
model_turn.py asks the model and records the answer, intents.py turns tool_use blocks
into calls, execution.py runs them (policy.py says what to do with a call a dead worker
left in flight), endings.py folds what follows a closed call or turn into the same write
and turns an interruption into its commit; driver.py sends the commits, from the claim to
the hand-off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from django.utils import timezone

from ..abort import AbortSignal
from ..agents import Agent
from ..clients import ModelClient, get_model_client
from ..conf import agentrun_settings
from ..models import Run, ToolCall, Turn
from ..runconfig import RunConfig
from ..store import Earlier, Lease, Write
from ..tools import Tool, ToolContext
from .history import Segment, TurnRecord


class Outcome:
    """What `advance` returns."""

    NOT_CLAIMED = "not_claimed"
    CONTINUED = "continued"  # handed back to the queue: a worker goes on with it
    PARKED = "parked"  # waits for a person
    FINISHED = "finished"  # completed, failed, cancelled or timed out
    LEASE_LOST = "lease_lost"  # another worker holds it now, or this one stopped in time


class Then(Enum):
    """What follows a commit."""

    GO_ON = "go on"  # this task goes on with the run (the lease is still held)
    HAND_OFF = "hand off"  # the lease was given back and a worker woken
    PARK = "park"  # the run waits for a person (lease given back)
    FINISH = "finish"  # the run ended (lease given back)

    @property
    def outcome(self) -> str:
        return {
            Then.HAND_OFF: Outcome.CONTINUED,
            Then.PARK: Outcome.PARKED,
            Then.FINISH: Outcome.FINISHED,
        }[self]


@dataclass
class Commit:
    """A step's ending or milestone, as a value: the write to send and what follows it;
    `failpoint` (name, qualifier) fires once it is durable."""

    write: Write
    then: Then = Then.GO_ON
    failpoint: tuple[str, str | None] | None = None
    sent: bool = False  # already sent, inside the transaction that ran an atomic tool


class Leave(Exception):  # noqa: N818 - control flow, not an error
    """Stop without writing more: the lease was lost, or must run out (`expire`) because
    it could not be renewed, so that the next claim counts a recovery."""

    def __init__(self, reason: str, *, expire: bool = False) -> None:
        super().__init__(reason)
        self.expire = expire


class Step:
    """One advance of one run under its lease: the run, its history in memory (turns and,
    per turn, its calls in order), the turn being worked on, and the lease's abort signal."""

    def __init__(
        self,
        run_id: Any,
        owner: str,
        abort: AbortSignal,
        client: ModelClient | None,
        *,
        settle_only: bool = False,
        steal_from: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.owner = owner
        self.abort = abort
        self._client = client
        self._config: tuple[Any, RunConfig] | None = None  # (the stored form, its RunConfig)
        self.settle_only = settle_only  # the reaper's step: the recovery policy only
        self.steal_from = steal_from
        self.lease: Lease | None = None
        self.took_over = False
        self.run: Run
        self.agent: Agent | None = None
        self.turns: list[Turn] = []
        self._calls: dict[int, list[ToolCall]] = {}
        self.turn: Turn | None = None  # the turn worked on (not yet written while asking)
        self.started: set[Any] = set()  # in_flight by this step, handler not yet run
        self.not_started: set[Any] = set()  # in_flight calls whose handler never ran
        self.turns_done = 0  # turns this task closed
        self.records: dict[int, Any] = {}  # closed turns as the request shows them (model_turn)
        self.earlier: list[Segment] = []  # what the conversation's earlier runs contribute
        self.earlier_ids: set[str] = set()  # their tool_use ids (unique in a history)
        self.earlier_version: list[tuple[Any, int]] = []  # their ids and last seqs, as read
        self.began = time.monotonic()

    # -- reading -------------------------------------------------------------------------

    @property
    def config(self) -> RunConfig:
        """The run's configuration, built once per run row read (a claim)."""
        stored = self.run.config
        if self._config is None or self._config[0] is not stored:
            self._config = (stored, RunConfig.of(stored))
        return self._config[1]

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            self._client = get_model_client()
        return self._client

    def load(self, turns: list[Turn], calls: list[ToolCall]) -> None:
        self.turns = list(turns)
        self._calls = {}
        for call in calls:
            self._calls.setdefault(call.turn_index, []).append(call)
        last = self.turns[-1] if self.turns else None
        self.turn = last if last is not None and last.state in _OPEN_TURN else None

    def load_earlier(self, earlier: Earlier) -> None:
        """The earlier runs of its conversation (read at the claim, once per task): what
        each contributes to the history, its turns' results rendered once."""
        calls: dict[tuple[Any, int], list[ToolCall]] = {}
        for call in earlier.calls:
            calls.setdefault((call.run_id, call.turn_index), []).append(call)
        turns: dict[Any, list[TurnRecord]] = {}
        for turn in earlier.turns:
            results = [
                c.tool_result_block()
                for c in calls.get((turn.run_id, turn.index), ())
                if c.is_closed
            ]
            turns.setdefault(turn.run_id, []).append(
                TurnRecord(turn.index, turn.content, results, turn.stop_reason, turn.prefix)
            )
        self.earlier = [Segment(r.input, r.context, turns.get(r.pk, [])) for r in earlier.runs]
        self.earlier_ids = {c.tool_call_id for c in earlier.calls}
        self.earlier_version = [(r.pk, r.last_seq) for r in earlier.runs]

    def calls_of(self, turn: Turn) -> list[ToolCall]:
        return self._calls.get(turn.index, [])

    def remember(self, turn: Turn, calls: list[ToolCall]) -> None:
        """A turn answered in this step joins the history."""
        if not any(t is turn for t in self.turns):
            self.turns.append(turn)
        self._calls[turn.index] = list(calls)

    def all_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in self.calls_of(t)]

    def tool(self, name: str) -> Tool | None:
        """The agent's tool of that name (None: no longer defined, or the agent is gone)."""
        return self.agent.tools.get(name) if self.agent else None

    def write(self) -> Write:
        """A new write of this run under the lease."""
        return Write(self.run, self.lease)

    def context(self, call: ToolCall) -> ToolContext:
        """What the handler (or reconcile check) of `call` knows and cooperates through."""

        def beat() -> None:
            ToolCall.objects.filter(pk=call.pk).update(heartbeat_at=timezone.now())

        return ToolContext(
            run_id=self.run.pk,
            tool_call_id=call.tool_call_id,
            idempotency_key=call.idempotency_key,
            attempt=call.attempt,
            tool_name=call.name,
            abort=self.abort,
            heartbeat=beat,
            holder=self.owner,
        )

    def deadline_passed(self) -> bool:
        return self.run.deadline is not None and self.run.deadline <= timezone.now()

    def may_keep_going(self) -> bool:
        """Whether this task goes on with the run's next turn itself (holding the lease and
        the history) rather than handing it back to the queue: a bounded number of turns
        and seconds, so that runs share the workers."""
        return (
            not self.settle_only
            and self.turns_done < agentrun_settings.TURNS_PER_TASK
            and time.monotonic() - self.began < agentrun_settings.TASK_SECONDS
        )


_OPEN_TURN = ("running", "awaiting_tool")
