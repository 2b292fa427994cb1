"""What follows a closed tool call or turn, folded into the write that closes it, and the
commit of an interruption.

A commit that closes a call also starts the next call when it may start at once (its
intent is durable and nothing stops it: write-ahead holds), or parks the run for the next
call's approval. A commit that closes a turn also moves the run: it completes on its final
turn, or goes on (in this task, holding the lease, or handed back to the queue). So a turn
with k tool calls costs k + 1 commits: the answer with the first call in flight, then each
result with what follows it.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import jsonschema
from django.db import transaction
from django.utils import timezone

from .. import signals, transitions
from ..abort import LEASE_UNRENEWED
from ..content import StoredResult
from ..events import EventType, payloads
from ..models import Run, ToolCall, Turn
from ..outcomes import Outcome, call_key
from ..states import ResultSource, RunState, SideEffect, ToolCallState
from ..store import Write, database_now, lock_call, lock_run, send
from ..tokens import approval_token
from ..tools import Tool
from .history import text_of
from .step import Commit, Leave, Step, Then

logger = logging.getLogger(__name__)


def after_call(step: Step, write: Write, turn: Turn) -> Then:
    """A call of `turn` closed in `write`: fold in what follows it."""
    following = next((c for c in step.calls_of(turn) if not c.is_closed), None)
    if following is None:
        transitions.complete_turn(write, turn)
        return after_turn(step, write, turn)
    if following.state != ToolCallState.REQUESTED or step.settle_only:
        return Then.GO_ON
    if step.abort.aborted or step.deadline_passed():
        return Then.GO_ON  # the loop meets the interruption before anything starts
    tool = step.tool(following.name)
    if tool is None or tool.side_effect == SideEffect.ATOMIC:
        return Then.GO_ON
    try:
        needs_approval = not following.approved and tool.needs_approval(
            following.arguments, step.run
        )
    except Exception:  # noqa: BLE001 - the loop meets it, after this result commits
        return Then.GO_ON
    if needs_approval:
        return park_for_approval(step, write, following, tool)
    start(step, write, following)
    return Then.GO_ON


def start(step: Step, write: Write, call: ToolCall) -> None:
    """`call` goes in flight in `write`; its handler runs once that is durable."""
    transitions.start_call(write, call)
    step.started.add(call_key(call))
    step.not_started.add(call_key(call))


def after_turn(step: Step, write: Write, turn: Turn) -> Then:
    """`turn` closed in `write` (the run is running or awaiting_tool): the run completes on
    its final turn, else goes on, here or handed back to the queue."""
    step.turns_done += 1
    step.turn = None
    if turn.is_final:
        complete(step, write, "max_turns")
        return Then.FINISH
    transitions.continue_run(write, step.run)
    if step.abort.aborted or step.may_keep_going():
        return Then.GO_ON  # an interruption is met by the driver, right after this commit
    transitions.hand_off(write, step.run)
    return Then.HAND_OFF


def complete(
    step: Step, write: Write, stop_reason: str, *, refusal: dict[str, Any] | None = None
) -> None:
    """The run completes with its final answer (the text of the turns that continued an
    answer cut off at max_tokens joined to it); with structured output, parsed and
    validated, or the run fails with `invalid_structured_output`."""
    answered = [t for t in step.turns if t.content]
    final = answered[-1] if answered else None
    parts = answered[-1:]
    for earlier in reversed(answered[:-1]):
        if earlier.stop_reason != "max_tokens" or step.calls_of(earlier):
            break
        parts.insert(0, earlier)
    output: dict[str, Any] = {
        "text": "".join(text_of(t.content) for t in parts),
        "content": final.content if final else [],
        **({"refusal": refusal} if refusal is not None else {}),
    }
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


def structured(text: str, schema: dict[str, Any], stop_reason: str) -> tuple[Any, str]:
    """(the answer parsed as JSON, "") when it follows `schema`, else (None, the problem)."""
    cut = " (the answer was cut off at max_tokens)" if stop_reason == "max_tokens" else ""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"The final answer is not valid JSON{cut}: {exc}"
    try:
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return None, f"The final answer does not follow the output schema at {where}: {exc.message}"
    return value, ""


def fail(
    step: Step, write: Write, code: str, message: str, phase: str, turn: Turn | None = None
) -> Commit:
    turn = turn if turn is not None else step.turn
    transitions.fail_run(
        write,
        step.run,
        code=code,
        message=message,
        phase=phase,
        turn=turn,
        calls=step.calls_of(turn) if turn is not None else None,
    )
    logger.warning("Run failed run_id=%s code=%s phase=%s", step.run.pk, code, phase)
    return Commit(write, Then.FINISH)


def park_for_approval(
    step: Step, write: Write, call: ToolCall, tool: Tool | None, *, already: bool = False
) -> Then:
    """`call` needs a person's approval: it and the run wait (the lease given back)."""
    if not already:
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
        deadline = timezone.now() + timedelta(seconds=timeout) if timeout else None
        transitions.ask_approval(write, call, payload, deadline)
    _park(step, write)
    run = step.run
    # The token is minted for the receivers, after the commit, never stored.
    write.then(
        lambda: signals.approval_requested.send(
            sender=Run, run=run, tool_call=call, token=approval_token(call)
        )
    )
    return Then.PARK


def park_unknown(step: Step, write: Write, call: ToolCall, reason: str, *, already: bool) -> Then:
    """The call's outcome is unknown: it and the run wait for a person."""
    if not already:
        transitions.mark_unknown(write, call, reason)
    _park(step, write)
    transitions.signal_after(
        write,
        signals.reconciliation_needed,
        run=step.run,
        tool_call=call,
        reason=call.unknown_reason,
    )
    return Then.PARK


def _park(step: Step, write: Write) -> None:
    transitions.park(write, step.run)


def interruption(step: Step) -> Commit:
    """The abort signal fired or the deadline passed: a cancel request or a deadline closes
    the run cleanly (its open turn and calls with synthetic results); a lost lease, or one
    that could not be renewed, leaves without writing (`Leave`)."""
    if step.abort.cancel_requested or _cancel_requested(step.run):
        return stop(step, RunState.CANCELLED, step.run.cancel_reason or "cancelled")
    if step.deadline_passed():
        return stop(step, RunState.TIMED_OUT, "deadline passed")
    raise Leave(
        f"Run {step.run_id}: aborted ({step.abort.reason})",
        expire=step.abort.reason == LEASE_UNRENEWED,
    )


def _cancel_requested(run: Run) -> bool:
    """Whether the run has a cancel request (read afresh: the heartbeat saw it, not us)."""
    found = (
        Run.objects.filter(pk=run.pk).values_list("cancel_requested_at", "cancel_reason").first()
    )
    if found is None or found[0] is None:
        return False
    run.cancel_requested_at, run.cancel_reason = found
    return True


def stop(step: Step, target: str, reason: str) -> Commit:
    """Cancel or time the run out now: its open turn and calls close with synthetic
    results (a call put in flight by this step whose handler never ran says so)."""
    if target == RunState.CANCELLED and not step.run.cancel_reason:
        _cancel_requested(step.run)
        reason = step.run.cancel_reason or reason
    write = step.write()
    turn = step.turn
    transitions.stop_run(
        write,
        step.run,
        target,
        reason,
        turn=turn,
        calls=step.calls_of(turn) if turn is not None else [],
        not_started=frozenset(step.not_started),
    )
    return Commit(write, Then.FINISH)


def cancel_parked(run: Run) -> None:
    """A cancel request arrived as the run parked: nobody holds it now, so it applies at
    once instead of waiting for a person."""
    with transaction.atomic():
        run = lock_run(run.pk)
        if run.state != RunState.AWAITING_APPROVAL:
            return
        write = Write(run)
        transitions.stop_run(write, run, RunState.CANCELLED, run.cancel_reason or "cancelled")
        send(write)


LATE = "the tool returned after its run was stopped or recovered: its result is kept"


def keep_result(step: Step, write: Write) -> bool:
    """A commit holding a tool's executed result was refused (a cancel stopped the run, or
    recovery took the lease meanwhile). The tool ran, so its result is recorded anyway on
    the call as it is now: closing it if it is still open (in_flight, or unknown after
    recovery: the run then goes on as after a person's decision), or in place of the
    synthetic result a cancel gave it. False when the commit held no executed result, or
    another live holder of the run settles the call."""
    change = next(
        (
            c
            for c in write.changed
            if isinstance(c.obj, ToolCall)
            and c.fields.get("result_source") == ResultSource.EXECUTED
        ),
        None,
    )
    if change is None:
        return False
    fields = change.fields
    result = StoredResult(fields["result"], fields["result_format"])
    with transaction.atomic():
        call, run = lock_call(change.obj.pk)  # the run's row, then the call's
        kept = Write(run)
        if call.state == ToolCallState.IN_FLIGHT and run.lease_owner:
            if run.lease_expires_at is not None and run.lease_expires_at > database_now():
                return False  # its new holder settles it
        if call.state in (ToolCallState.IN_FLIGHT, ToolCallState.UNKNOWN):
            outcome = Outcome(change.obj.state, result, fields["is_error"], ResultSource.EXECUTED)
            transitions.close_call(kept, call, outcome, extra={"late": True})
            transitions.after_decision(kept, run, call)
        elif call.state == ToolCallState.CANCELLED and call.result_source == ResultSource.SYNTHETIC:
            kept.change(
                call,
                call.state,
                result=result.value,
                result_format=result.format,
                is_error=fields["is_error"],
                result_source=ResultSource.EXECUTED,
            )
            extra = {"by": None, "note": LATE}
            kept.record(
                payloads.call_result(call, kind=EventType.TOOL_RESULT_REPLACED, extra=extra)
            )
        else:
            return False
        send(kept)
    logger.warning("%s run_id=%s tool_call_id=%s", LATE, run.pk, call.tool_call_id)
    return True


def describe(value: Any) -> str:
    """An exception as the run's error message: its type and its text."""
    return f"{type(value).__name__}: {value}" if str(value) else type(value).__name__
