"""A person's decisions on tool calls: approve, reject, resolve an unknown outcome, repair a
stopped run's history; and the signed resume tokens that keep decisions from going stale."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import store, telemetry, transitions
from ..agents import get_agent, run_tool
from ..content import stored_result
from ..events import EventType, payloads
from ..exceptions import ApprovalError, InvalidArguments, InvalidTransition
from ..fields import check_json, check_text
from ..models import Run, ToolCall
from ..states import ResultSource, RunState, ToolCallState
from ..tokens import check_approval_token
from ..tools import ToolArgumentsError, arguments_hash
from .retrying import retry_lost_race

logger = logging.getLogger(__name__)

# Runs no worker advances, whose history a person may repair before resume_run.
REPAIRABLE = (RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT)


def _lock_call(tool_call: ToolCall | Any) -> tuple[ToolCall, Run]:
    pk = getattr(tool_call, "pk", tool_call)
    try:
        # The one lock order (store/locks.py): the run, then the call.
        return store.lock_call(pk)
    except ToolCall.DoesNotExist as exc:
        raise ApprovalError(f"Tool call {pk} does not exist.") from exc


def _check_token(call: ToolCall, token: str | None) -> None:
    """A token, when given, is checked first: a stale or forged one is refused (409
    `invalid_token` in the API) even where the decision would be a no-op."""
    if token is not None:
        check_approval_token(call, token)


def _check_awaiting(call: ToolCall) -> None:
    """A decision on `call` needs it awaiting approval."""
    if call.state != ToolCallState.AWAITING_APPROVAL:
        raise ApprovalError(
            f"Tool call {call.tool_call_id} is {call.state}, not awaiting approval."
        )


def declined_text(reason: str) -> str:
    """What the model reads when a person declines a call: one sentence, with the reason."""
    reason = " ".join(reason.split())
    if not reason:
        return "A person declined this tool call."
    return f"A person declined this tool call: {reason}{'' if reason[-1] in '.!?' else '.'}"


def _decided(by: Any, note: str) -> dict[str, Any]:
    return {
        "decided_by": by if getattr(by, "pk", None) else None,
        "decided_at": timezone.now(),
        "decision_note": note,
    }


@retry_lost_race
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
        _check_token(call, token)
        if call.approved and call.state != ToolCallState.AWAITING_APPROVAL and arguments is None:
            return call
        _check_awaiting(call)
        fields: dict[str, Any] = {"approved": True, **_decided(by, note)}
        edited = None
        if arguments is not None:
            tool = run_tool(run, call.name, agent=get_agent(run.agent))
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
                edited = canonical
        write = store.Write(run)
        decided = {k: v for k, v in fields.items() if k != "approved"}
        transitions.approve_call(write, call, decided, by=by, note=note, edited=edited)
        transitions.after_decision(write, run, call)
        store.send(write)
    telemetry.decided(run, call, "approved")
    logger.info("Tool call approved run_id=%s tool_call_id=%s", run.pk, call.tool_call_id)
    return call


@retry_lost_race
def reject_tool_call(
    tool_call: ToolCall | Any, *, by: Any, reason: str, token: str | None = None
) -> ToolCall:
    """Decline a waiting call: it closes with an is_error result that tells the model why."""
    check_text(reason, "The reason")
    with transaction.atomic():
        call, run = _lock_call(tool_call)
        _check_token(call, token)
        if call.state == ToolCallState.REJECTED:
            return call
        _check_awaiting(call)
        write = store.Write(run)
        transitions.close_call(
            write,
            call,
            transitions.CallEnding(
                ToolCallState.REJECTED, declined_text(reason), True, ResultSource.PERSON
            ),
            fields=_decided(by, reason),
            extra=payloads.decision("rejected", by, reason),
            kind=EventType.APPROVAL_DECIDED,
        )
        transitions.after_decision(write, run, call)
        store.send(write)
    telemetry.decided(run, call, "rejected")
    logger.info("Tool call rejected run_id=%s tool_call_id=%s", run.pk, call.tool_call_id)
    return call


@retry_lost_race
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
        _check_token(call, token)
        if call.state != ToolCallState.UNKNOWN:
            raise ApprovalError(f"Tool call {call.tool_call_id} is {call.state}, not unknown.")
        extra = payloads.decision(action, by, note)
        closing = {
            "fields": _decided(by, note),
            "extra": extra,
            "kind": EventType.TOOL_CALL_RESOLVED,
        }
        write = store.Write(run)
        if action in ("done", "fail"):
            failed = f"The tool call failed (decided by a person). {note}".strip()
            outcome = (
                transitions.CallEnding(ToolCallState.SUCCEEDED, done, False, ResultSource.PERSON)
                if action == "done"
                else transitions.CallEnding(
                    ToolCallState.ERRORED, failed, True, ResultSource.PERSON
                )
            )
            transitions.close_call(write, call, outcome, **closing)
        elif action == "retry":
            transitions.retry_call(write, call, _decided(by, note), extra)
        else:
            raise ApprovalError(f"Unknown action {action!r}: use done, retry or fail.")
        transitions.after_decision(write, run, call)
        store.send(write)
    telemetry.decided(run, call, f"resolved:{action}")
    logger.info(
        "Tool call resolved run_id=%s tool_call_id=%s action=%s", run.pk, call.tool_call_id, action
    )
    return call


@retry_lost_race
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
        if run.state not in REPAIRABLE:
            raise InvalidTransition(
                f"Run {run.pk} is {run.state}: tool results can be replaced only in a failed, "
                "cancelled or timed-out run."
            )
        if not call.is_closed:
            raise InvalidTransition(
                f"Tool call {call.tool_call_id} is {call.state}: only a closed call's result "
                "can be replaced."
            )
        write = store.Write(run)
        transitions.replace_result(write, call, stored, is_error=is_error, by=by, note=note)
        store.send(write)
    logger.info(
        "Tool result replaced run_id=%s tool_call_id=%s by=%s",
        run.pk,
        call.tool_call_id,
        payloads.user_id(by),
    )
    return call
