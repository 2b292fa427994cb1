"""What one advance of a run knows (`Step`), and the value each of its phases ends with
(`Commit`: a write, and what follows it: `Then`). The one decision of what follows a step
is follows.py's table.

The other modules of the engine are the phases: claim.py decides at the claim and before
each turn, model_turn.py asks the model and records the answer with its tool calls,
execution.py runs the calls (policy.py says what to do with a call a dead worker left in
flight); driver.py sends the commits, from the claim to the hand-off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from django.utils import timezone

from .. import failpoints, streams
from ..abort import AbortSignal
from ..agents import Agent, run_tool
from ..catalog import Prices, model_info
from ..clients import ModelClient, get_model_client
from ..conf import agentrun_settings
from ..models import Run, ToolCall, Turn
from ..runconfig import RunConfig
from ..store import Earlier, Lease, Write, chosen
from ..tools import Tool
from .history import Segment, segments

logger = logging.getLogger(__name__)


class Then(Enum):
    """What follows a commit (or a step that writes nothing more)."""

    GO_ON = "go on"  # this task goes on with the run (the lease is still held)
    HAND_OFF = "hand off"  # the lease was given back and a worker woken
    PARK = "park"  # the run waits for a person (lease given back)
    FINISH = "finish"  # the run ended (lease given back)
    LEAVE = "leave"  # stop, writing nothing: the lease is lost (someone else holds the run)
    EXPIRE = "expire"  # the same, letting the lease run out: the next claim counts a recovery


class Sent(Enum):
    """Who sends a commit's write: the driver, but for two writes that commit with more."""

    BY_DRIVER = "by the driver"
    WITH_CLAIM = "with the claim's UPDATE, in one transaction"
    WITH_ATOMIC_TOOL = "with an atomic tool's own ORM writes, in one transaction"


@dataclass
class Commit:
    """A step's ending or milestone, as a value: the write to send and what follows it;
    `failpoint` (name, qualifier) fires once it is durable. A step that stops without
    writing (`Then.LEAVE`, `Then.EXPIRE`) has no write, and says why (`reason`)."""

    write: Write | None
    then: Then = Then.GO_ON
    failpoint: tuple[str, str | None] | None = None
    sent: Sent = Sent.BY_DRIVER
    reason: str = ""

    @classmethod
    def stop(cls, then: Then, reason: str) -> Commit:
        return cls(None, then, reason=reason)


class Step:
    """One advance of one run under its lease: the run, its history in memory (turns and,
    per turn, its calls in order), the turn being worked on, and the lease's abort signal;
    and what it resolves once, at its start: the store its writes go to, the streams'
    publisher (None: no live streams), the failpoints armed, the model's prices."""

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
        self.prices: Prices | None = None  # the run's model's (catalog/), read with `config`
        self.store = chosen()
        self.publisher = streams.publisher()
        self.failpoints = failpoints.armed()
        self.settle_only = settle_only  # the reaper's step: the recovery policy only
        self.steal_from = steal_from
        self.lease: Lease | None = None
        self.claimed_expiry: datetime | None = None  # the lease's expiry the claim read
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

    @property
    def config(self) -> RunConfig:
        """The run's configuration, built once per run row read (a claim), and its model's
        prices with it (`prices`: None for a model the table does not price)."""
        stored = self.run.config
        if self._config is None or self._config[0] is not stored:
            self._config = (stored, RunConfig.of(stored))
            info = model_info(self._config[1].model)
            self.prices = info.prices if info is not None else None
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
        self.earlier = segments(earlier.runs, earlier.turns, earlier.calls)
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
        """The run's tool of that name: the agent's own, or an MCP server's as the run's
        snapshot has it (agents.run_tool; None: no longer defined, or the agent is gone)."""
        if self.agent is None:
            return None
        # The agent's own tool first, as run_tool has it, without the call out: a step asks
        # once per call (the engine's hot path, tests/postgres/test_trace.py).
        own = self.agent.tools.get(name)
        if own is not None:
            return own
        return run_tool(self.run, name, agent=self.agent, config=self.config)

    def write(self) -> Write:
        """A new write of this run under the lease."""
        return Write(self.run, self.lease, nudge=streams.notify if self.publisher else None)

    def now(self) -> datetime:
        """The database's time, as the claim read it (its lease's expiry, less the lease)
        and this process's monotonic clock has counted since: a deadline is judged, and an
        approval's set, by the clock that judges leases, never by a wall clock that jumped.
        Before a claim (or without one): this process's time."""
        if self.lease is None or self.claimed_expiry is None:
            return timezone.now()
        return self.claimed_expiry + timedelta(seconds=time.monotonic() - self.lease.valid_until)

    def deadline_passed(self) -> bool:
        return self.run.deadline is not None and self.run.deadline <= self.now()

    def before_effect(self) -> bool:
        """Whether to stop before an effect (a model request, a tool's handler): the abort
        signal's `before_effect`, read here (a turn's path stays in the engine's files): a
        process late past its lease's renewal takes it back first, or stops."""
        gate = self.abort.gate
        if gate is not None and not self.abort.aborted:
            gate()
        return self.abort.aborted

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
