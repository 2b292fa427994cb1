"""Each event's payload, built in one place. The keys are stored data (the projection and
people read them): a change here is a change of the history's format.

Each builder returns `(type, payload)`, reading the states from the objects after their
transition (`transitions.py` calls them right after the state move)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .types import EventType

Event = tuple[str, dict[str, Any]]


def user_id(user: Any) -> Any:
    """How a payload names a person: their pk (None for the system)."""
    return getattr(user, "pk", None)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _if(condition: Any, **keys: Any) -> dict[str, Any]:
    """A payload's optional keys: `keys` when `condition` holds, none otherwise."""
    return keys if condition else {}


def _call(call: Any) -> dict[str, Any]:
    return {"turn_index": call.turn_index, "tool_call_id": call.tool_call_id}


def _turn(turn: Any) -> dict[str, Any]:
    return {"turn_index": turn.index, "turn_state": turn.state}


# --------------------------------------------------------------------------- runs


def context_hook(config: Any) -> str:
    """The text the agent's context hook gave a run (its configuration snapshot keeps it)."""
    hook = config.get("context_hook") if isinstance(config, dict) else None
    return hook if isinstance(hook, str) else ""


def run_created(run: Any, owner: Any, *, forked_by: Any = None) -> Event:
    """The agent's configuration is the run's (Run.config), not repeated here. A run of a
    conversation also names it, its place in it and its message's context: its history
    starts with the earlier runs' (their events rebuild it: projection.project_conversation).
    A fork names the run and turn it was forked from, and who forked it (`forked_by`)."""
    return EventType.RUN_CREATED, {
        "run_state": run.state,
        "agent": run.agent,
        "input": run.input,
        "correlation_id": run.correlation_id,
        "metadata": run.metadata,
        "owner": user_id(owner),
        "deadline": _iso(run.deadline),
        # start_run(context=...) or the agent's hook; a conversation's run names it anyway.
        **_if(run.context, context=run.context),
        # The hook's part of it: the author's, left out of what the API shows.
        **_if(context_hook(run.config), context_hook=context_hook(run.config)),
        **_if(
            run.conversation_id is not None,
            conversation=str(run.conversation_id),
            position=run.conversation_position,
            context=run.context,
        ),
        **_if(
            run.forked_from_id is not None,
            forked_from=str(run.forked_from_id),
            forked_at_turn=run.forked_at_turn,
            forked_by=user_id(forked_by),
        ),
    }


def run_rolled_back(by: Any, next_run: Any) -> Event:
    return EventType.RUN_ROLLED_BACK, {"by": user_id(by), "next_run": str(next_run)}


def run_started(run: Any, worker: str) -> Event:
    return EventType.RUN_STARTED, {"run_state": run.state, "worker": worker}


def recovery(attempts: int, epoch: int) -> Event:
    return EventType.RECOVERY, {"attempts": attempts, "epoch": epoch}


def cancel_requested(by: Any, reason: str) -> Event:
    return EventType.CANCEL_REQUESTED, {"by": user_id(by), "reason": reason}


def run_closed(run: Any, reason: str) -> Event:
    """run_cancelled or run_timed_out, by the run's new state."""
    kind = EventType.RUN_CANCELLED if run.state == "cancelled" else EventType.RUN_TIMED_OUT
    return kind, {"run_state": run.state, "reason": reason}


def run_resumed(run: Any, by: Any, previous: str) -> Event:
    return EventType.RUN_RESUMED, {"run_state": run.state, "by": user_id(by), "from": previous}


def run_failed(run: Any, code: str, message: str, phase: str, checkpoint: int) -> Event:
    return EventType.RUN_FAILED, {
        "run_state": run.state,
        "error_code": code,
        "error_message": message,
        "phase": phase,
        "last_checkpoint": checkpoint,
    }


def run_completed(
    run: Any, stop_reason: str, output: Any, usage: dict[str, int], parsed: Any = None
) -> Event:
    """The output's text; its content is the last answer's, recorded with that answer. A
    refusal's details and a structured output's parsed value, when there are any."""
    answer = output if isinstance(output, dict) else {}
    return EventType.RUN_COMPLETED, {
        "run_state": run.state,
        "stop_reason": stop_reason,
        "output": {"text": output.get("text", "")} if isinstance(output, dict) else output,
        "usage": usage,
        **_if("refusal" in answer, refusal=answer.get("refusal")),
        **_if(parsed is not None, parsed_output=parsed),
    }


def run_continued(run: Any) -> Event:
    return EventType.RUN_CONTINUED, {"run_state": run.state}


def run_parked(run: Any) -> Event:
    return EventType.RUN_PARKED, {"run_state": run.state}


def reaper_requeued(run: Any) -> Event:
    return EventType.REAPER_REQUEUED, {"state": run.state}


def budget_exceeded(limit: str, projected: float, allowed: float) -> Event:
    return EventType.BUDGET_EXCEEDED, {"limit": limit, "projected": projected, "allowed": allowed}


# --------------------------------------------------------------------------- turns


def turn_started(turn: Any, state: str | None = None) -> Event:
    """`state`: the state the turn started in, when it is no longer the turn's (a fork
    describes a copied, closed turn as it started: running)."""
    return EventType.TURN_STARTED, {
        "turn_index": turn.index,
        "turn_state": state or turn.state,
        "final": turn.is_final,
    }


def turn_completed(turn: Any) -> Event:
    return EventType.TURN_COMPLETED, _turn(turn)


def turn_cancelled(turn: Any) -> Event:
    return EventType.TURN_CANCELLED, _turn(turn)


def turn_failed(turn: Any) -> Event:
    return EventType.TURN_FAILED, _turn(turn)


def model_response(
    turn: Any,
    response: Any,
    content: list,
    usage: dict,
    cost: Any,
    *,
    turn_state: str | None = None,
    run_state: str | None = None,
    discarded: bool = False,
) -> Event:
    """The recorded answer. `turn_state` and `run_state`: the states the answer leaves the
    turn and the run in, when it settles them; a `discarded` answer (unusable, or paid for
    and never part of the conversation) says so. `response` is a ModelResponse, or the
    copied turn a fork describes (which has no stop details or thinking tokens)."""
    stop_details = getattr(response, "stop_details", None)
    thinking_tokens = getattr(response, "thinking_tokens", None)
    return EventType.MODEL_RESPONSE, {
        "turn_index": turn.index,
        "message_id": response.message_id,
        "request_id": response.request_id,
        "model": response.model,
        "stop_reason": response.stop_reason,
        "content": content,
        "usage": usage,
        "cost_usd": str(cost),
        **_if(stop_details, stop_details=stop_details),
        **_if(thinking_tokens, thinking_tokens=thinking_tokens),
        **_if(discarded, discarded=True),
        **_if(turn_state is not None, turn_state=turn_state),
        **_if(run_state is not None, run_state=run_state),
    }


# --------------------------------------------------------------------------- tool calls


def tool_call_requested(call: Any) -> Event:
    return EventType.TOOL_CALL_REQUESTED, {
        **_call(call),
        "position": call.position,
        "name": call.name,
        "arguments": call.arguments,
        "arguments_hash": call.arguments_hash,
        "side_effect": str(call.side_effect),
        "idempotency_key": call.idempotency_key,
        "tool_call_state": "requested",
    }


def loop_detected(call: Any, count: int) -> Event:
    return EventType.LOOP_DETECTED, {**_call(call), "name": call.name, "count": count}


def tool_call_started(call: Any) -> Event:
    return EventType.TOOL_CALL_STARTED, {
        **_call(call),
        "attempt": call.attempt,
        "tool_call_state": call.state,
    }


def call_result(
    call: Any,
    *,
    kind: str = EventType.TOOL_CALL_FINISHED,
    extra: dict[str, Any] | None = None,
) -> Event:
    """A call closed (or its result replaced) with the result it now holds:
    tool_call_finished, an approval decision that closes it, a resolution, a repair."""
    return kind, {
        **_call(call),
        "tool_call_state": call.state,
        "result": call.result,
        "result_format": str(call.result_format),
        "is_error": call.is_error,
        "source": call.result_source,
        **(extra or {}),
    }


def intercepted(call: Any) -> Event:
    """A call closed at once when it was requested (a guard, bad arguments, an unknown or
    truncated tool): its synthetic error result."""
    return EventType.TOOL_CALL_FINISHED, {
        **_call(call),
        "tool_call_state": call.state,
        "result": call.result,
        "is_error": True,
        "source": call.result_source,
    }


def tool_call_recovered(call: Any, policy: str) -> Event:
    return EventType.TOOL_CALL_RECOVERED, {
        **_call(call),
        "policy": policy,
        "tool_call_state": call.state,
    }


def tool_call_unknown(call: Any, reason: str) -> Event:
    return EventType.TOOL_CALL_UNKNOWN, {
        **_call(call),
        "reason": reason,
        "tool_call_state": call.state,
    }


def tool_call_retried(call: Any, decision: dict[str, Any]) -> Event:
    """A person chose `retry` for an unknown call: it is requested again."""
    return EventType.TOOL_CALL_RESOLVED, {
        **_call(call),
        "tool_call_state": call.state,
        **decision,
    }


def approval_requested(call: Any, payload: dict, deadline: datetime | None) -> Event:
    """No resume token: a token is minted for whoever shows the decision, never stored."""
    return EventType.APPROVAL_REQUESTED, {
        **_call(call),
        "payload": payload,
        "deadline": _iso(deadline),
        "tool_call_state": call.state,
    }


def approval_granted(call: Any, by: Any, note: str, arguments: Any = None) -> Event:
    """`arguments`: the arguments a person edited the call to, when they did."""
    return EventType.APPROVAL_DECIDED, {
        **_call(call),
        "decision": "approved",
        "by": user_id(by),
        "note": note,
        **_if(arguments is not None, arguments=arguments),
        "tool_call_state": call.state,
    }


def decision(action: str, by: Any, note: str) -> dict[str, Any]:
    """The keys a person's decision adds to a call's event."""
    return {"decision": action, "by": user_id(by), "note": note}
