"""The model turn: build the request from the history in memory, call the model with the
engine's own bounded, cancellable backoff, and commit the complete answer with its tool
calls (the write-ahead intent) before any tool runs: the turn, its calls, the usage, and
what follows (the first call in flight, a park for its approval, or the turn closed)."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from functools import partial
from typing import Any

from django.db import DatabaseError

from .. import streams, transitions
from ..clients import ModelError, ModelRequest, ModelResponse, StreamAborted
from ..conf import agentrun_settings
from ..events import payloads
from ..failpoints import failpoint
from ..models import Turn
from ..states import ToolCallState, TurnState
from . import endings, guards
from .history import (
    CONTINUE_NOTICE,
    RESUME_NOTICE,
    TurnRecord,
    add_user,
    build_messages,
    close_paused,
    has_thinking,
    keep_valid_thinking,
    model_failure,
    prefix_hash,
    sanitize_content,
    user_message,
)
from .intents import intents
from .step import Commit, Step, Then

logger = logging.getLogger(__name__)


def ask(step: Step, turn: Turn) -> Commit:
    """Ask the model for this turn's answer; the commit that records it."""
    try:
        req = request(step, turn)
        response, retries = call_model(step, req, deltas=streams.turn_stream(step.run, turn.index))
    except StreamAborted:
        return endings.interruption(step)
    except ModelError as exc:
        code, message = model_failure(exc)
        return endings.fail(step, step.write(), code, message[:2000], "model")
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - deterministic: the same request fails again
        # The request could not be built or sent (a value the SDK cannot encode, a client
        # bug): recovering would only repeat it, so the run fails at once, saying so.
        logger.exception("Model request failed run_id=%s", step.run_id)
        message = f"The request to the model could not be built or sent: {endings.describe(exc)}"
        return endings.fail(step, step.write(), "model_request_failed", message[:2000], "model")
    failpoint("model.before_commit")
    if has_thinking(response.content):
        # What its thinking blocks are bound to, to know later whether they still hold.
        turn.prefix = prefix_hash(req.model, req.system, req.tools, req.messages)
    return record(step, turn, response, retries)


def request(step: Step, turn: Turn) -> ModelRequest:
    config = step.config
    system = config.system_blocks
    run = step.run
    records = _records(step)
    origins: dict[int, tuple[dict[str, Any], TurnRecord]] = {}
    messages = build_messages(
        run.input, records, context=run.context, earlier=step.earlier, origins=origins
    )
    options = dict(config.options)
    tool_choice = options.pop("tool_choice", None)
    if records and records[-1].cut_off:
        add_user(messages, user_message(CONTINUE_NOTICE))  # continue_on_max_tokens
    elif messages[-1]["role"] == "assistant" and not _continued(records):
        # A final answer sent back (a resume after invalid_structured_output): current
        # models refuse a request that ends with it (a prefill), so a user message asks again.
        add_user(messages, user_message(RESUME_NOTICE))
    if turn.is_final:
        # In the last user message, never in the system prompt: the system prompt (and the
        # tools) must be what they were when any thinking block of the history was made.
        close_paused(messages)  # a paused turn is not continued: the notice follows it
        add_user(messages, user_message(guards.FINAL_TURN_NOTICE))
        tool_choice = {"type": "none"} if config.tools else None
    if not config.tools:
        tool_choice = None  # the API refuses a tool_choice without tools
    tools = list(config.tools)
    messages = keep_valid_thinking(
        messages, origins, model=config.model, system=system, tools=tools
    )
    return ModelRequest(
        model=config.model,
        messages=messages,
        max_tokens=config.max_tokens,
        system=system,
        tools=tools,
        tool_choice=tool_choice,
        cache_prefix=config.prompt_caching,
        cache_ttl=config.cache_ttl,
        context_management=config.context_management,
        stop_sequences=list(options.pop("stop_sequences", None) or ()),
        metadata=dict(config.metadata),
        options=options,
    )


def _continued(records: list[TurnRecord]) -> bool:
    """The last answer is one the API goes on from when it is sent back last: a turn it
    paused (server tools) or stopped after compacting."""
    answered = [r for r in records if r.content]
    return bool(answered) and answered[-1].stop_reason in ("pause_turn", "compaction")


def _records(step: Step) -> list[TurnRecord]:
    """What each turn contributes to the request; a closed turn's is made once per task
    (its results rendered once), so a turn costs the same however long the history."""
    records = []
    for t in step.turns:
        record = step.records.get(t.index)
        if record is None:
            record = TurnRecord(
                index=t.index,
                content=t.content,
                results=[c.tool_result_block() for c in step.calls_of(t) if c.is_closed],
                stop_reason=t.stop_reason,
                prefix=t.prefix,
            )
            if t.state == TurnState.COMPLETED:
                step.records[t.index] = record
        records.append(record)
    return records


def call_model(
    step: Step, req: ModelRequest, deltas: streams.TurnStream | None = None
) -> tuple[ModelResponse, int]:
    """The complete response and how many retries it took; each attempt's deltas go to
    `deltas` (a live view only: an attempt that fails starts them over)."""
    retries = agentrun_settings.MODEL_RETRIES
    for attempt in range(retries + 1):
        if step.abort.aborted:
            raise StreamAborted(step.abort.reason)
        sent = req if deltas is None else replace(req, on_event=deltas.attempt(attempt))
        try:
            return complete(step.client.create(sent, abort=step.abort)), attempt
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


def record(step: Step, turn: Turn, response: ModelResponse, retries: int) -> Commit:
    """The write-ahead intent: the answer, its tool calls (`requested`, or closed at once
    by a guard), the usage; then what follows, in the same commit."""
    write, run = step.write(), step.run
    content = sanitize_content(response.content)
    usage = response.usage.as_dict()
    billed = response.usage.as_billed()  # with cache writes by TTL and server tool use
    cost = guards.cost_of(step.config.model, billed)
    stop = response.stop_reason or ""
    blocks = [b for b in content if b.get("type") == "tool_use"]
    truncated_id = (
        content[-1].get("id")
        if stop in ("max_tokens", "model_context_window_exceeded")
        and content
        and content[-1].get("type") == "tool_use"
        else None
    )
    answered = partial(payloads.model_response, turn, response, content, billed, cost)
    answer: dict[str, Any] = dict(
        message_id=response.message_id,
        request_id=response.request_id,
        model=response.model,
        stop_reason=stop,
        model_attempts=retries + 1,
        # The nested parts as returned (server tool requests, cache writes by TTL).
        usage_details={k: v for k, v in billed.items() if k not in usage},
        **usage,
    )
    if turn.prefix:
        answer["prefix"] = turn.prefix
    # Usage is counted here, once per recorded response.
    write.count(**usage, cost_usd=cost, turn_count=1)
    ids = [b.get("id") for b in blocks]
    earlier = {c.tool_call_id for c in step.all_calls()} | step.earlier_ids
    if not all(ids) or len(set(ids)) != len(ids) or earlier.intersection(ids):
        # Unanswerable: results could not be matched to calls, and the API would refuse
        # this content in the history (ids are unique across a conversation's runs too).
        # Keep it in the event only and stop here.
        transitions.answer_turn(write, turn, answer, answered, [], discarded=True)
        return endings.fail(
            step,
            write,
            "invalid_model_output",
            "The model returned tool_use blocks with missing, duplicate or reused ids; the "
            "response was recorded (and paid for) but not used.",
            "model",
            turn=turn,
        )
    calls = intents(step, write, turn, blocks, truncated_id)
    exceeded = stop == "model_context_window_exceeded"
    transitions.answer_turn(
        write,
        turn,
        {**answer, "content": content},
        answered,
        calls,
        # The run waits for the open calls, unless the answer ends it.
        run=None if exceeded else run,
    )
    step.remember(turn, calls)
    if exceeded:
        return endings.fail(
            step,
            write,
            "context_window_exceeded",
            "The conversation no longer fits the model's context window.",
            "model",
            turn=turn,
        )
    then = _then(step, write, turn, calls, stop, response)
    return Commit(write, then, ("model.after_commit", None))


def _then(
    step: Step, write: Any, turn: Turn, calls: list[Any], stop: str, response: ModelResponse
) -> Then:
    if any(not c.is_closed for c in calls):
        first = next(c for c in calls if not c.is_closed)
        if first.state == ToolCallState.REQUESTED:
            # As if the call before it had just closed: start it, or park for its approval.
            return endings.after_call(step, write, turn)
        return Then.GO_ON
    if calls:
        return endings.after_turn(step, write, turn)
    # No tools asked for: the turn is complete.
    if turn.is_final:
        step.turns_done += 1
        endings.complete(step, write, "max_turns")
        return Then.FINISH
    continued = stop == "max_tokens" and step.config.continue_on_max_tokens
    if stop in ("pause_turn", "compaction") or continued:
        # The API paused its own loop (server tools) or stopped after compacting: the next
        # turn sends this content back as the last message and the API goes on from it.
        return endings.after_turn(step, write, turn)
    step.turns_done += 1
    refusal = None
    if stop == "refusal":
        # The model that answered (the API may have fallen back to another) and why.
        refusal = {"model": response.model, **(response.stop_details or {})}
        refusal.pop("type", None)
    endings.complete(step, write, stop, refusal=refusal)
    return Then.FINISH
