"""Forking a run from one of its turns: a new queued run whose history is a copy of the
original's turns before that one, each closed tool call with its recorded result (nothing
is re-executed), so the engine asks the model again at that turn.

The fork belongs to whoever forked it (`by`) and acts with their credentials (an MCP
server's headers, `metadata.user_id`), never with the original owner's: a tool that acts on
behalf of a run's owner must not act for the owner on someone else's request. Forked by
server-side code (no `by`), or of an agent whose runs act for their owner
(`Agent(run_as="owner")`), it stays the original owner's (authority.fork_owner). Who
forked it is in its `run_created` event (`forked_by`). Its usage and cost start with the copied turns' (they are its conversation:
the budget and `max_turns` see all of it, as they would had it run them itself).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import store, transitions, wakeups
from ..agents import owner_user_id
from ..clients.base import USAGE_KEYS
from ..engine.guards import cost_of
from ..events import EventType, payloads
from ..exceptions import InvalidInput, InvalidTransition
from ..models import Run, RunEvent, ToolCall, Turn, idempotency_key_for
from ..runconfig import RunConfig
from ..states import TurnState
from .authority import fork_owner
from .retrying import retry_lost_race
from .runs import check_refusals

logger = logging.getLogger(__name__)

TURN_CLOSED = (TurnState.COMPLETED, TurnState.CANCELLED, TurnState.FAILED)
_TURN_ENDED = {
    TurnState.COMPLETED: payloads.turn_completed,
    TurnState.CANCELLED: payloads.turn_cancelled,
    TurnState.FAILED: payloads.turn_failed,
}


class ForkRefused(InvalidTransition):
    """This run cannot be forked at that turn."""


@dataclass(frozen=True)
class ForkPoint:
    """Whether the model can be asked again at turn `turn`, with the history before it."""

    turn: int
    allowed: bool
    reason: str = ""


def fork_points(run: Run) -> list[ForkPoint]:
    """Every turn of `run`, and whether a fork may start there (`reason` says why not)."""
    turns = list(run.turns.order_by("index"))
    calls: dict[int, list[ToolCall]] = {}
    for call in run.tool_calls.order_by("turn_index", "position"):
        calls.setdefault(call.turn_index, []).append(call)
    # A later run of a conversation starts from the earlier runs' history, which a fork
    # (a run of its own) would not have.
    follow_up = (
        "the run follows earlier runs of its conversation; a fork would lose their history"
        if run.conversation_position
        else ""
    )
    points = [ForkPoint(0, not follow_up, follow_up)]
    still_open = ""
    for turn in turns:
        still_open = still_open or _open(turn, calls.get(turn.index, []))
        reason = follow_up or still_open or _ended(turn, calls.get(turn.index, []))
        points.append(ForkPoint(turn.index + 1, not reason, reason))
    return points


def _open(turn: Turn, calls: list[ToolCall]) -> str:
    """Why no fork may copy `turn`: it is open, or one of its calls has no result."""
    open_calls = [c for c in calls if not c.is_closed]
    if open_calls:
        first = open_calls[0]
        return (
            f"turn {turn.index} has a tool call that is not closed ({first.name} "
            f"{first.tool_call_id} is {first.state}); a fork would leave it without a result"
        )
    if turn.state not in TURN_CLOSED:
        return f"turn {turn.index} is still {turn.state}"
    return ""


# Answers without tools that the next turn goes on from: a turn the API paused (server
# tools), a compaction, an answer cut off at max_tokens (continued after a user message).
_GOES_ON = ("pause_turn", "compaction", "max_tokens")


def _ended(turn: Turn, calls: list[ToolCall]) -> str:
    """Why the model cannot be asked again right after `turn`: it answered for good."""
    if turn.content and not calls and turn.stop_reason not in _GOES_ON:
        return (
            f"turn {turn.index} answered without asking for a tool (stop_reason "
            f"{turn.stop_reason or 'none'}): the conversation ended there"
        )
    return ""


@retry_lost_race
def fork_run(run: Run | Any, *, at_turn: int, by: Any = None) -> Run:
    """Start a new run that asks the model again at turn `at_turn` of `run`, with a copy
    of the turns before it (their tool calls closed, with their recorded results).

    The fork is queued with the original's agent, configuration snapshot, input and
    metadata, owned by `by` (authority.fork_owner), and linked to it (`forked_from`,
    `forked_at_turn`); a worker picks it up on commit. InvalidInput for a turn the run does not have; ForkRefused when a turn before
    `at_turn` is still open or has a tool call without a result, or when the conversation
    ended before it.
    """
    if isinstance(at_turn, bool) or not isinstance(at_turn, int) or at_turn < 0:
        raise InvalidInput("The turn to fork from must be a turn index (0 or more).")
    with transaction.atomic():
        # Serialises with a repair of the original's results (replace_tool_result).
        original = store.lock_run(getattr(run, "pk", run))
        points = fork_points(original)
        if at_turn >= len(points):
            raise InvalidInput(f"Run {original.pk} has no turn {at_turn}: {_offer(points)}.")
        point = points[at_turn]
        if not point.allowed:
            raise ForkRefused(
                f"Run {original.pk} cannot be forked at turn {at_turn}: {point.reason}."
            )
        # The same rules as a new run: a snapshot the model now refuses is a 400 here.
        check_refusals(original.config, f"Run {original.pk}")
        fork = _copy(original, at_turn, by)
        wakeups.on_commit(fork.pk)
    logger.info(
        "Run forked run_id=%s from=%s at_turn=%s by=%s",
        fork.pk,
        original.pk,
        at_turn,
        payloads.user_id(by),
    )
    return fork


def _offer(points: list[ForkPoint]) -> str:
    """The turns a fork may start at, as ranges ("fork from turn 0, 2 to 4")."""
    spans: list[list[int]] = []
    for point in points:
        if point.allowed:
            if spans and spans[-1][1] == point.turn - 1:
                spans[-1][1] = point.turn
            else:
                spans.append([point.turn, point.turn])
    if not spans:
        return "it cannot be forked at any turn"
    text = ", ".join(str(a) if a == b else f"{a} to {b}" for a, b in spans)
    return f"fork from turn {text}"


def _copy(original: Run, at_turn: int, by: Any) -> Run:
    turns = list(original.turns.filter(index__lt=at_turn).order_by("index"))
    calls = list(
        original.tool_calls.filter(turn_index__lt=at_turn).order_by("turn_index", "position")
    )
    config = RunConfig.of(original.config)
    model = config.model
    owner = fork_owner(original, by)
    stored = original.config
    if owner != original.owner:
        # The model provider's end-user id is the new owner's too.
        stored = {key: value for key, value in original.config.items() if key != "metadata"}
        if owner_user_id(owner) is not None:
            stored["metadata"] = {"user_id": owner_user_id(owner)}
    recorded = _recorded_responses(original, at_turn)
    # Each turn costs what was recorded when it was answered (its usage as the API sent
    # it, cache writes by TTL and server tool use included); priced again only without one.
    costs = {
        t.index: sum((c for _, c in recorded[t.index]), Decimal(0))
        if t.index in recorded
        else cost_of(model, t.recorded_usage())
        for t in turns
    }
    billed = {i: r[0][0] for i, r in recorded.items() if len(r) == 1}
    limit = config.deadline_seconds
    now = timezone.now()
    fork = Run(
        agent=original.agent,
        input=original.input,
        # Its context (the hook's text and the caller's) goes with every turn it replays.
        context=original.context,
        config=stored,
        owner=owner,
        metadata=original.metadata,
        correlation_id=uuid.uuid4().hex,
        # The agent's own time limit starts over; a one-off deadline stays with the original.
        deadline=now + timedelta(seconds=limit) if limit else None,
        forked_from=original,
        forked_at_turn=at_turn,
        created_at=now,
        turn_count=sum(1 for t in turns if t.content is not None),
        cost_usd=sum(costs.values(), Decimal(0)),
        **{key: sum(getattr(t, key) for t in turns) for key in USAGE_KEYS},
    )
    copies = {t.index: _turn_copy(fork, t) for t in turns}
    call_copies = [_call_copy(fork, copies[c.turn_index], c) for c in calls]
    history: list[payloads.Event] = []
    for turn in turns:
        own = [c for c in call_copies if c.turn_index == turn.index]
        usage = billed.get(turn.index, turn.usage())
        history.extend(_turn_events(copies[turn.index], own, costs[turn.index], usage))
    return transitions.create_run(
        fork, forked_by=by, turns=copies.values(), calls=call_copies, history=history
    )


def _turn_copy(fork: Run, turn: Turn) -> Turn:
    return Turn(
        run=fork,
        index=turn.index,
        state=turn.state,
        is_final=turn.is_final,
        content=turn.content,
        message_id=turn.message_id,
        request_id=turn.request_id,
        model=turn.model,
        stop_reason=turn.stop_reason,
        model_attempts=turn.model_attempts,
        usage_details=turn.usage_details,
        prefix=turn.prefix,
        started_at=turn.started_at,
        finished_at=turn.finished_at,
        **turn.usage(),
    )


def _call_copy(fork: Run, turn: Turn, call: ToolCall) -> ToolCall:
    return ToolCall(
        run=fork,
        turn=turn,
        turn_index=call.turn_index,
        tool_call_id=call.tool_call_id,
        position=call.position,
        name=call.name,
        arguments=call.arguments,
        arguments_hash=call.arguments_hash,
        side_effect=call.side_effect,
        idempotency_key=idempotency_key_for(fork.pk, call.tool_call_id),
        state=call.state,
        attempt=call.attempt,
        started_at=call.started_at,
        heartbeat_at=call.heartbeat_at,
        finished_at=call.finished_at,
        result=call.result,
        result_format=call.result_format,
        is_error=call.is_error,
        result_source=call.result_source,
        unknown_reason=call.unknown_reason,
        approved=call.approved,
        decided_by=call.decided_by,
        decided_at=call.decided_at,
        decision_note=call.decision_note,
        original_arguments=call.original_arguments,
        created_at=call.created_at,
    )


def _recorded_responses(run: Run, before: int) -> dict[int, list[tuple[dict, Decimal]]]:
    """The (usage, cost) each model_response event of `run` recorded, by turn index."""
    out: dict[int, list[tuple[dict, Decimal]]] = {}
    events = RunEvent.objects.filter(run=run, type=EventType.MODEL_RESPONSE).order_by("seq")
    for payload in events.values_list("payload", flat=True):
        index = payload.get("turn_index")
        if isinstance(index, int) and index < before and "cost_usd" in payload:
            out.setdefault(index, []).append(
                (payload.get("usage") or {}, Decimal(str(payload["cost_usd"])))
            )
    return out


def _turn_events(
    turn: Turn, calls: list[ToolCall], cost: Decimal, usage: dict
) -> list[payloads.Event]:
    """The events that describe a copied turn as the engine's describe a turn it runs:
    started, answered, its calls requested and closed, ended (the projection rebuilds it)."""
    events = [payloads.turn_started(turn, TurnState.RUNNING)]
    if turn.content is not None or any(turn.usage().values()):
        events.append(
            payloads.model_response(
                turn,
                turn,
                turn.content or [],
                usage,
                cost,
                # Paid for, never part of the conversation.
                discarded=turn.content is None,
                turn_state=TurnState.AWAITING_TOOL if turn.content is not None and calls else None,
            )
        )
    events.extend(payloads.tool_call_requested(call) for call in calls)
    events.extend(payloads.call_result(call, kind=EventType.TOOL_CALL_FINISHED) for call in calls)
    events.append(_TURN_ENDED[turn.state](turn))
    return events
