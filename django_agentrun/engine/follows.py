"""The one decision of what follows a step: `FOLLOWS`, a table keyed by where the run is
(`At`) and what the step ended with (`Ended`), whose rows name what the write carries next
(transitions, in order) and what happens after the commit; `commit_of` applies it to a
write, from the facts the phase knows (`Facts`, typed). Each phase of the engine says where
the run is and what it ended with; no phase decides what follows on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, NamedTuple

from .. import signals, transitions
from ..abort import LEASE_UNRENEWED
from ..models import Run, ToolCall, Turn
from ..outcomes import CallEnding
from ..states import TOOL_CALL_CLOSED, RunState, ToolCallState
from ..store import Write, cancel_request
from ..tokens import approval_token
from ..tools import Tool, batch
from .history import final_output, structured
from .step import Commit, Step, Then

logger = logging.getLogger(__name__)


@dataclass
class Facts:
    """What a phase knows when its step ends, as the table's rows read it (each field set by
    the phase or by the point that classified what follows)."""

    turn: Turn | None = None  # the turn worked on
    call: ToolCall | None = None  # the call the row is about
    tool: Tool | None = None  # its tool (None: no longer defined)
    batch: list[ToolCall] | None = None  # the calls that start with it, at once
    calls: list[ToolCall] | None = None  # the in_flight calls requeued together
    ending: CallEnding | None = None  # how the call ended
    endings: list[tuple[ToolCall, CallEnding]] | None = None  # how a batch's calls ended
    extra: dict[str, Any] | None = None  # what the call's event adds
    change: tuple[Any, ...] = ()  # the arguments of the call's change (a policy, a reason)
    reason: str = ""  # why the run stops (a cancel's, a deadline's, a lost lease's)
    reread: bool = False  # read the cancel's reason afresh
    code: str = ""  # a failure's code, message and phase
    message: str = ""
    phase: str = ""
    delay: float = 0.0  # a rate limit's wait
    limited: dict[str, Any] | None = None  # the API's refusal it waits out, if it was one
    stop_reason: str = ""  # the answer's stop reason
    refusal: dict[str, Any] | None = None  # a refused answer's details


class At(Enum):
    """Where the run is when a step ends: what the write being built holds so far."""

    CLAIM = "claimed"  # the lease taken (the start, a recovery in the write)
    BEFORE_TURN = "before a turn"  # no turn open; the next one would be asked
    ANSWER = "answered"  # the model's answer and its calls are in the write
    OPEN_CALL = "an open call"  # the open turn's first open call; nothing written yet
    HANDLER = "handler returned"  # a call's handler ended (or could not start)
    POLICY = "policy decided"  # the recovery policy for an in_flight call a dead worker left
    NEXT_CALL = "a call closed"  # a call closed in the write (or the answer opened calls)
    TURN_CLOSED = "turn closed"  # every call of the turn is closed in the write
    SETTLED = "settled"  # the reaper's step: no in_flight call left to apply the policy to
    INTERRUPTED = "interrupted"  # the abort signal fired or the deadline passed
    REFUSED = "refused"  # a commit with a tool's executed result was refused; result kept


class Ended(Enum):
    """What a step ended with (the facts a phase reads; the table says what follows)."""

    # at the claim
    CLAIMED = "claimed"
    CANCEL_REQUESTED = "cancel requested"
    DEADLINE_PASSED = "deadline passed"
    RECOVERIES_EXHAUSTED = "too many recoveries"
    AGENT_UNKNOWN = "agent unknown"
    # before a turn
    TURN_LIMIT = "turn limit reached"
    BUDGET_BREACHED = "budget would be breached"
    ASK = "ask the model"
    # the answer
    MODEL_FAILED = "model call failed"
    REQUEST_FAILED = "request could not be built or sent"
    STREAM_ABORTED = "stream aborted"
    UNUSABLE_IDS = "tool_use ids missing, duplicate or reused"
    CONTEXT_EXCEEDED = "context window exceeded"
    RATE_LIMITED = "rate limited: nothing answered (429, 529, the governor's not now)"
    CALLS_OPEN = "calls to run"
    CALLS_CLOSED = "every call closed by a guard"
    FINAL_TURN = "no calls, final turn"
    PAUSED = "no calls, the API goes on from it"
    ANSWERED = "no calls, final answer"
    # an open call
    INTERRUPTED = "the abort signal fired or the deadline passed"
    STARTED_HERE = "put in flight by this step"
    UNKNOWN = "outcome unknown"
    AWAITING_APPROVAL = "awaiting approval"
    IN_FLIGHT_FOUND = "in flight, its executor died"
    TOOL_GONE = "tool no longer defined"
    NEEDS_APPROVAL = "needs approval"
    ATOMIC = "atomic tool"
    STARTS = "may start (with the calls after it that may run at once with it: a batch)"
    BATCH_STARTED = "put in flight by this step, with the others of its batch"
    NONE_OPEN = "none open"
    # a handler, the recovery policy
    RESULT = "result"
    RESULTS = "the batch's results"
    STOPPED = "stopped without a cancel"
    RERUN = "may run again"
    RECONCILED = "reconciled: done"
    # the next call, after one closed
    NONE_LEFT = "no call left"
    NOT_NOW = "not startable with this commit"
    # a closed turn
    LAST_TURN = "the final turn"
    GOES_ON = "the task goes on"
    TASK_SPENT = "the task's turns or seconds are spent"
    # the reaper's step, an interruption, a refusal
    NOTHING_LEFT = "nothing left"
    LEASE_LOST = "lease lost"
    LEASE_UNRENEWED = "lease not renewed"
    RESULT_KEPT = "result kept"


class Follow(NamedTuple):
    """A row: what the write carries next (transitions, in order) and what happens after
    it: a `Then`, or another point (`At`) whose row follows in the same write. A row whose
    `carries` starts with `phase:` names the work whose commit comes next."""

    carries: tuple[str, ...]
    then: Then | At


FOLLOWS: dict[tuple[At, Ended], Follow] = {
    # The claim (its write is sent with the claim's statement).
    (At.CLAIM, Ended.CANCEL_REQUESTED): Follow(("stop_run:cancelled",), Then.FINISH),
    (At.CLAIM, Ended.DEADLINE_PASSED): Follow(("stop_run:timed_out",), Then.FINISH),
    (At.CLAIM, Ended.RECOVERIES_EXHAUSTED): Follow(("fail_run",), Then.FINISH),
    (At.CLAIM, Ended.AGENT_UNKNOWN): Follow(("fail_run",), Then.FINISH),
    (At.CLAIM, Ended.CLAIMED): Follow((), Then.GO_ON),
    # Before a turn: the guards that end the run first.
    (At.BEFORE_TURN, Ended.TURN_LIMIT): Follow(("complete_run:max_turns",), Then.FINISH),
    (At.BEFORE_TURN, Ended.BUDGET_BREACHED): Follow(("fail_run",), Then.FINISH),
    (At.BEFORE_TURN, Ended.ASK): Follow(("phase:ask",), Then.GO_ON),
    # The answer: the write-ahead intent, and what it carries.
    (At.ANSWER, Ended.MODEL_FAILED): Follow(("fail_run",), Then.FINISH),
    (At.ANSWER, Ended.REQUEST_FAILED): Follow(("fail_run",), Then.FINISH),
    (At.ANSWER, Ended.STREAM_ABORTED): Follow((), At.INTERRUPTED),
    (At.ANSWER, Ended.UNUSABLE_IDS): Follow(("fail_run",), Then.FINISH),
    (At.ANSWER, Ended.CONTEXT_EXCEEDED): Follow(("fail_run",), Then.FINISH),
    # Nothing paid: the lease and the slot given back, a worker woken when the limit allows.
    (At.ANSWER, Ended.RATE_LIMITED): Follow(("hold",), Then.HAND_OFF),
    # (The answer's write moves the run to awaiting_tool with it: transitions.answer_turn.)
    (At.ANSWER, Ended.CALLS_OPEN): Follow((), At.NEXT_CALL),
    (At.ANSWER, Ended.CALLS_CLOSED): Follow(("count_turn",), At.TURN_CLOSED),
    (At.ANSWER, Ended.FINAL_TURN): Follow(("count_turn",), At.TURN_CLOSED),
    (At.ANSWER, Ended.PAUSED): Follow(("count_turn",), At.TURN_CLOSED),
    (At.ANSWER, Ended.ANSWERED): Follow(("count_turn", "complete_run"), Then.FINISH),
    # The open turn's first open call (nothing written yet).
    (At.OPEN_CALL, Ended.STARTED_HERE): Follow(("phase:run_call",), At.HANDLER),
    (At.OPEN_CALL, Ended.BATCH_STARTED): Follow(("phase:run_batch",), At.HANDLER),
    (At.OPEN_CALL, Ended.INTERRUPTED): Follow((), At.INTERRUPTED),
    (At.OPEN_CALL, Ended.UNKNOWN): Follow(("park:unknown",), Then.PARK),
    (At.OPEN_CALL, Ended.AWAITING_APPROVAL): Follow(("park:approval",), Then.PARK),
    (At.OPEN_CALL, Ended.IN_FLIGHT_FOUND): Follow(("phase:settle",), At.POLICY),
    (At.OPEN_CALL, Ended.TOOL_GONE): Follow(("close_call",), At.NEXT_CALL),
    (At.OPEN_CALL, Ended.NEEDS_APPROVAL): Follow(("ask_approval", "park:approval"), Then.PARK),
    (At.OPEN_CALL, Ended.ATOMIC): Follow(("phase:run_atomic",), At.HANDLER),
    (At.OPEN_CALL, Ended.STARTS): Follow(("start_call",), Then.GO_ON),
    (At.OPEN_CALL, Ended.NONE_OPEN): Follow(("complete_turn", "count_turn"), At.TURN_CLOSED),
    # A handler ended: its result closes the call, or (stopped by a lost lease, not by a
    # cancel: its outcome unknown) nothing is recorded and recovery applies the policy.
    (At.HANDLER, Ended.INTERRUPTED): Follow((), At.INTERRUPTED),
    (At.HANDLER, Ended.RESULT): Follow(("close_call",), At.NEXT_CALL),
    (At.HANDLER, Ended.RESULTS): Follow(("close_calls",), At.NEXT_CALL),  # in one write
    (At.HANDLER, Ended.STOPPED): Follow((), Then.EXPIRE),
    # The recovery policy for a call a dead worker left in flight (policy.py).
    (At.POLICY, Ended.RERUN): Follow(("requeue_call",), Then.GO_ON),
    (At.POLICY, Ended.RECONCILED): Follow(("close_call",), At.NEXT_CALL),
    (At.POLICY, Ended.UNKNOWN): Follow(("mark_unknown", "park:unknown"), Then.PARK),
    # A call closed: the next one starts in the same commit when it may (its intent is
    # durable), or the run parks for its approval; none left: the turn closes.
    (At.NEXT_CALL, Ended.NONE_LEFT): Follow(("complete_turn", "count_turn"), At.TURN_CLOSED),
    (At.NEXT_CALL, Ended.STARTS): Follow(("start_call",), Then.GO_ON),
    (At.NEXT_CALL, Ended.NEEDS_APPROVAL): Follow(("ask_approval", "park:approval"), Then.PARK),
    (At.NEXT_CALL, Ended.NOT_NOW): Follow((), Then.GO_ON),  # the loop meets it next
    # A turn closed: the run completes on its final turn, else goes on (here, or handed
    # back to the queue after the task's turns or seconds).
    (At.TURN_CLOSED, Ended.LAST_TURN): Follow(("complete_run:max_turns",), Then.FINISH),
    (At.TURN_CLOSED, Ended.GOES_ON): Follow(("continue_run",), Then.GO_ON),
    (At.TURN_CLOSED, Ended.TASK_SPENT): Follow(("continue_run", "hand_off"), Then.HAND_OFF),
    # The reaper's step, once no in_flight call is left.
    (At.SETTLED, Ended.NOTHING_LEFT): Follow(("hand_off",), Then.HAND_OFF),
    # An interruption, met between two commits.
    (At.INTERRUPTED, Ended.CANCEL_REQUESTED): Follow(("stop_run:cancelled",), Then.FINISH),
    (At.INTERRUPTED, Ended.DEADLINE_PASSED): Follow(("stop_run:timed_out",), Then.FINISH),
    (At.INTERRUPTED, Ended.LEASE_LOST): Follow((), Then.LEAVE),
    (At.INTERRUPTED, Ended.LEASE_UNRENEWED): Follow((), Then.EXPIRE),
    # A refused commit whose tool result was recorded anyway (driver.keep_result).
    (At.REFUSED, Ended.RESULT_KEPT): Follow((), Then.LEAVE),
}


def commit_of(
    step: Step,
    write: Write,
    at: At,
    ended: Ended,
    failpoint: tuple[str, str | None] | None = None,
    **known: Any,
) -> Commit:
    """The commit of a step that ended with `ended` at `at`, knowing `known` (Facts' fields):
    the write with what the table says follows folded in (or no write: the step stops)."""
    facts = Facts(**known)
    then = follow(step, write, at, ended, facts)
    if then in (Then.LEAVE, Then.EXPIRE):
        return Commit.stop(then, facts.reason)
    return Commit(write, then, failpoint)


def follow(step: Step, write: Write, at: At, ended: Ended, facts: Facts) -> Then:
    """Apply the table's rows from (`at`, `ended`) to `write` until one names what
    happens after the commit."""
    while True:
        row = FOLLOWS[at, ended]
        for action in row.carries:
            ACTIONS[action](step, write, facts)
        if isinstance(row.then, Then):
            return row.then
        at = row.then
        ended = CLASSIFY[at](step, facts)


# -- the facts each point reads -------------------------------------------------------


def next_call(step: Step, facts: Facts) -> Ended:
    """A call of the turn closed (or the answer opened calls): may the next start now?"""
    turn = facts.turn
    following = next((c for c in step.calls_of(turn) if c.state not in TOOL_CALL_CLOSED), None)
    if following is None:
        return Ended.NONE_LEFT
    if following.state != ToolCallState.REQUESTED or step.settle_only:
        return Ended.NOT_NOW
    tool = step.tool(following.name)
    try:
        ended = may_start(step, following, tool)
    except Exception:  # noqa: BLE001 - the loop meets it, after this result commits
        return Ended.NOT_NOW
    if ended not in (Ended.STARTS, Ended.NEEDS_APPROVAL):
        return Ended.NOT_NOW  # the loop meets the interruption, the gone tool, the atomic one
    facts.call, facts.tool = following, tool
    facts.batch = batch(step.calls_of(turn), following, step.tool, step.run)
    return ended


def may_start(step: Step, call: ToolCall, tool: Tool | None) -> Ended:
    """The one decision of whether a requested call may start now: not once the abort
    signal fired or the deadline passed, nor when its tool is gone, nor before a person
    approved it if it needs that; an atomic tool starts inside its result's transaction."""
    if step.abort.aborted or step.deadline_passed():
        return Ended.INTERRUPTED
    if tool is None:
        return Ended.TOOL_GONE
    if not call.approved and tool.needs_approval(call.arguments, step.run):
        return Ended.NEEDS_APPROVAL
    if tool.in_transaction:
        return Ended.ATOMIC
    return Ended.STARTS


def turn_closed(step: Step, facts: Facts) -> Ended:
    """The turn closed: its run ends on the final turn, else goes on here or elsewhere."""
    if facts.turn.is_final:
        return Ended.LAST_TURN
    if step.abort.aborted or step.may_keep_going():
        return Ended.GOES_ON  # an interruption is met by the driver, right after this commit
    return Ended.TASK_SPENT


def interrupted(step: Step, facts: Facts) -> Ended:
    """The abort signal fired or the deadline passed: a cancel request or a deadline
    closes the run cleanly (its open turn and calls with synthetic results); a lost lease,
    or one that could not be renewed, stops without writing."""
    if step.abort.cancel_requested or _cancel_requested(step.run):
        facts.reason, facts.reread = step.run.cancel_reason or "cancelled", True
        return Ended.CANCEL_REQUESTED
    if step.deadline_passed():
        facts.reason = "deadline passed"
        return Ended.DEADLINE_PASSED
    facts.reason = f"Run {step.run_id}: aborted ({step.abort.reason})"
    if step.abort.reason == LEASE_UNRENEWED:
        return Ended.LEASE_UNRENEWED
    return Ended.LEASE_LOST


CLASSIFY = {At.NEXT_CALL: next_call, At.TURN_CLOSED: turn_closed, At.INTERRUPTED: interrupted}


def _cancel_requested(run: Run) -> bool:
    """Whether the run has a cancel request (read afresh: the heartbeat saw it, not us)."""
    found = cancel_request(run.pk)
    if found is not None:
        run.cancel_requested_at, run.cancel_reason = found
    return found is not None


# -- what a row carries: each a transition (or two) on the write ----------------------


def _stop_run(target: str) -> Any:
    def stop(step: Step, write: Write, facts: Facts) -> None:
        """Cancel or time the run out: its open turn and calls close with synthetic
        results (a call put in flight by this step whose handler never ran says so)."""
        reason = facts.reason
        if target == RunState.CANCELLED and not step.run.cancel_reason and facts.reread:
            _cancel_requested(step.run)
            reason = step.run.cancel_reason or reason
        turn = step.turn
        calls = step.calls_of(turn) if turn is not None else []
        closing = {"turn": turn, "calls": calls, "not_started": frozenset(step.not_started)}
        transitions.stop_run(write, step.run, target, reason, **closing)

    return stop


def _fail_run(step: Step, write: Write, facts: Facts) -> None:
    turn = facts.turn or step.turn
    code, phase = facts.code, facts.phase
    transitions.fail_run(
        write,
        step.run,
        code=code,
        message=facts.message,
        phase=phase,
        turn=turn,
        calls=step.calls_of(turn) if turn is not None else None,
    )
    logger.warning("Run failed run_id=%s code=%s phase=%s", step.run.pk, code, phase)


def _complete_run(stop_reason: str | None) -> Any:
    def complete_run(step: Step, write: Write, facts: Facts) -> None:
        complete(step, write, stop_reason or facts.stop_reason, refusal=facts.refusal)

    return complete_run


def complete(
    step: Step, write: Write, stop_reason: str, *, refusal: dict[str, Any] | None = None
) -> None:
    """The run completes with its final answer (history.final_output); with structured
    output, parsed and validated, or the run fails with `invalid_structured_output`."""
    output = final_output(step.turns, lambda t: bool(step.calls_of(t)), refusal)
    parsed = None
    schema = step.config.output_format
    if schema and refusal is None:
        parsed, problem = structured(output["text"], schema["schema"], stop_reason)
        if problem:
            transitions.fail_run(
                write,
                step.run,
                code="invalid_structured_output",
                message=problem[:2000],
                phase="model",
            )
            logger.warning("Run failed run_id=%s code=invalid_structured_output", step.run.pk)
            return
    transitions.complete_run(write, step.run, stop_reason, output, parsed)
    logger.info("Run completed run_id=%s stop_reason=%s", step.run.pk, stop_reason)


def _count_turn(step: Step, write: Write, facts: Facts) -> None:
    step.turns_done += 1
    step.turn = None


def _start_call(step: Step, write: Write, facts: Facts) -> None:
    """The call (or its batch) goes in flight in `write`; handlers run once that is durable."""
    for call in facts.batch or [facts.call]:
        transitions.start_call(write, call)
        step.started.add((call.turn_index, call.tool_call_id))
        step.not_started.add((call.turn_index, call.tool_call_id))


def _ask_approval(step: Step, write: Write, facts: Facts) -> None:
    """The call needs a person's approval: what they need to decide, and until when."""
    call, tool = facts.call, facts.tool
    timeout = (
        tool.approval_timeout.total_seconds() if tool and tool.approval_timeout else None
    ) or step.config.approval_timeout_seconds
    payload = {
        "tool": call.name,
        "description": tool.description if tool else "",
        "arguments": call.arguments,
        "side_effect": str(call.side_effect),
        "run_id": str(step.run_id),
        "turn_index": call.turn_index,
    }
    deadline = step.now() + timedelta(seconds=timeout) if timeout else None
    transitions.ask_approval(write, call, payload, deadline)


def _park_for_approval(step: Step, write: Write, facts: Facts) -> None:
    """The call and the run wait for a person's approval (the lease given back)."""
    call, run = facts.call, step.run
    transitions.park(write, run)
    # The token is minted for the receivers, after the commit, never stored.
    write.then(
        lambda: signals.send(
            signals.approval_requested,
            sender=Run,
            run=run,
            tool_call=call,
            token=approval_token(call),
        )
    )


def _park_unknown(step: Step, write: Write, facts: Facts) -> None:
    """The call's outcome is unknown: it and the run wait for a person."""
    call = facts.call
    transitions.park(write, step.run)
    transitions.signal_after(
        write,
        signals.reconciliation_needed,
        run=step.run,
        tool_call=call,
        reason=call.unknown_reason,
    )


def _actions() -> dict[str, Any]:
    def call_change(change: Any) -> Any:
        return lambda step, write, facts: change(write, facts.call, *facts.change)

    return {
        "stop_run:cancelled": _stop_run(RunState.CANCELLED),
        "stop_run:timed_out": _stop_run(RunState.TIMED_OUT),
        "fail_run": _fail_run,
        "complete_run": _complete_run(None),
        "complete_run:max_turns": _complete_run("max_turns"),
        "count_turn": _count_turn,
        "start_call": _start_call,
        "ask_approval": _ask_approval,
        "park:approval": _park_for_approval,
        "park:unknown": _park_unknown,
        "close_calls": lambda step, write, facts: transitions.close_calls(write, facts.endings),
        "close_call": lambda step, write, facts: transitions.close_call(
            write, facts.call, facts.ending, extra=facts.extra
        ),
        "mark_unknown": call_change(transitions.mark_unknown),
        "requeue_call": lambda step, write, facts: transitions.requeue_calls(
            write, facts.calls or [facts.call], *facts.change
        ),
        "complete_turn": lambda step, write, facts: transitions.complete_turn(write, facts.turn),
        "continue_run": lambda step, write, facts: transitions.continue_run(write, step.run),
        "hand_off": lambda step, write, facts: transitions.hand_off(write, step.run),
        "hold": lambda step, write, facts: transitions.hold(
            write, step.run, facts.delay, facts.limited
        ),
    }


ACTIONS = _actions()
