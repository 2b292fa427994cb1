"""The model turn: build the request from the recorded history, call the model with the
engine's own bounded, cancellable backoff, and commit the complete answer with its tool
calls in `requested` (the write-ahead intent) before any tool runs."""

from __future__ import annotations

import logging
import random
from typing import Any

from django.utils import timezone

from .. import transitions
from ..clients import ModelError, ModelRequest, ModelResponse, StreamAborted
from ..conf import agentrun_settings
from ..events import payloads
from ..failpoints import failpoint
from ..models import Turn
from ..states import RunState, TurnState
from . import guards
from .history import TurnRecord, build_messages, model_failure, sanitize_content
from .intents import intents
from .step import Step

logger = logging.getLogger(__name__)


def model_step(step: Step, turn: Turn) -> None:
    """Ask the model for this turn's answer and record it (one commit)."""
    try:
        response, retries = call_model(step, request(step, turn))
    except StreamAborted:
        step.interrupted()
    except ModelError as exc:
        with step.tx():
            code, message = model_failure(exc)
            step.fail(code, message[:2000], "model", turn=turn)
    failpoint("model.before_commit")
    with step.tx():
        record_response(step, turn, response, retries)
    failpoint("model.after_commit")


def request(step: Step, turn: Turn) -> ModelRequest:
    config = step.config
    system: list[dict[str, Any]] = []
    if config.get("system"):
        system.append({"type": "text", "text": config["system"]})
    tool_choice = None
    if turn.is_final:
        system.append({"type": "text", "text": guards.FINAL_TURN_NOTICE})
        tool_choice = {"type": "none"} if config.get("tools") else None
    return ModelRequest(
        model=config["model"],
        messages=build_messages(step.run.input, _records(step)),
        max_tokens=config.get("max_tokens") or agentrun_settings.DEFAULT_MAX_TOKENS,
        system=system,
        tools=list(config.get("tools") or []),
        tool_choice=tool_choice,
        cache_prefix=bool(config.get("prompt_caching", True)),
    )


def _records(step: Step) -> list[TurnRecord]:
    return [
        TurnRecord(
            index=t.index,
            content=t.content,
            results=[c.tool_result_block() for c in t.calls if c.is_closed],  # type: ignore[attr-defined]
        )
        for t in step.turns
    ]


def call_model(step: Step, req: ModelRequest) -> tuple[ModelResponse, int]:
    """The complete response and how many retries it took."""
    retries = agentrun_settings.MODEL_RETRIES
    for attempt in range(retries + 1):
        if step.abort.aborted:
            raise StreamAborted(step.abort.reason)
        try:
            return complete(step.client.create(req, abort=step.abort)), attempt
        except ModelError as exc:
            if not exc.retryable or attempt == retries:
                raise
            base = agentrun_settings.MODEL_RETRY_BASE_SECONDS * (2**attempt)
            delay = min(
                max(exc.retry_after or 0.0, base), agentrun_settings.MODEL_RETRY_MAX_SECONDS
            )
            delay *= 1 + random.random() * 0.1
            logger.warning(
                "Model call failed (status=%s), retrying in %.1fs run_id=%s",
                exc.status,
                delay,
                step.run_id,
            )
            if step.abort.wait(delay):
                raise StreamAborted(step.abort.reason) from exc
    raise AssertionError("unreachable")


def complete(response: ModelResponse) -> ModelResponse:
    """Only a complete response is recorded or executed: one without a stop reason was cut
    short (whatever client produced it), so it is retried like a dropped connection."""
    if not response.stop_reason:
        raise ModelError(
            "The model's response has no stop reason: it is incomplete.", retryable=True
        )
    return response


def record_response(step: Step, turn: Turn, response: ModelResponse, retries: int) -> None:
    """The write-ahead intent: the answer, its tool calls (`requested`, or closed at once
    by a guard), the usage; then the turn closes if nothing is left to run."""
    work, run = step.work(), step.run
    content = sanitize_content(response.content)
    usage = response.usage.as_dict()
    cost = guards.cost_of(step.config["model"], usage)
    stop = response.stop_reason
    blocks = [b for b in content if b.get("type") == "tool_use"]
    truncated_id = (
        content[-1].get("id")
        if stop in ("max_tokens", "model_context_window_exceeded")
        and content
        and content[-1].get("type") == "tool_use"
        else None
    )
    old_turn = turn.state
    answer = payloads.model_response(turn, response, content, usage, cost)
    work.record(answer)
    ids = [b.get("id") for b in blocks]
    earlier = {c.tool_call_id for t in step.turns for c in t.calls}  # type: ignore[attr-defined]
    if not all(ids) or len(set(ids)) != len(ids) or earlier.intersection(ids):
        # Unanswerable: results could not be matched to calls, and the API would refuse
        # this content in the history. Keep it in the event only and stop here.
        answer[1]["discarded"] = True
        work.update(
            turn,
            None,
            message_id=response.message_id,
            request_id=response.request_id,
            stop_reason=stop,
            **usage,
        )
        step.fail(
            "invalid_model_output",
            "The model returned tool_use blocks with missing, duplicate or reused ids; the "
            "response was recorded (and paid for) but not used.",
            "model",
            turn=turn,
            incr={**usage, "cost_usd": cost},
        )
    calls = intents(step, turn, blocks, truncated_id)
    work.insert(calls)
    turn.calls = calls  # type: ignore[attr-defined]
    turn.content = content
    transitions.move(turn, TurnState.AWAITING_TOOL if calls else TurnState.COMPLETED)
    answer[1]["turn_state"] = turn.state
    fields: dict[str, Any] = dict(
        content=content,
        message_id=response.message_id,
        request_id=response.request_id,
        model=response.model,
        stop_reason=stop,
        model_attempts=retries + 1,
        **usage,
    )
    if not calls:
        fields["finished_at"] = timezone.now()
    work.update(turn, old_turn, **fields)
    # Usage is counted here, once per recorded response.
    incr = {**usage, "cost_usd": cost, "turn_count": 1}
    if stop == "model_context_window_exceeded":
        step.fail(
            "context_window_exceeded",
            "The conversation no longer fits the model's context window.",
            "model",
            turn=turn,
            incr=incr,
        )
    if calls and all(c.is_closed for c in calls):
        step.close_turn(turn, incr=incr)
    elif calls:
        old = transitions.move(run, RunState.AWAITING_TOOL)
        answer[1]["run_state"] = run.state
        step.write(old_state=old, incr=incr)
    else:
        work.record(payloads.turn_completed(turn))
        if turn.is_final:
            step.complete("max_turns", incr=incr)
        if stop == "pause_turn":
            step.go_on(incr=incr)
        step.complete(stop, incr=incr)
