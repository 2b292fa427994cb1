"""The model turn: build the request from the history in memory, call the model with the
engine's own bounded, cancellable backoff, and commit the complete answer with its tool
calls (the write-ahead intent) before any tool runs: the turn, its calls, the usage, and
what follows (step.FOLLOWS: the first call in flight, a park for its approval, or the turn
closed).

Its tool calls are intents, with the guards on them: one ToolCall per tool_use block. A
call a guard intercepts (cut off by max_tokens, the final turn, an unknown tool, over the
per-turn cap, bad arguments, a repeated identical call) closes at once with a synthetic
is_error result the model can act on; the others wait in `requested`."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from functools import partial
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from .. import streams, telemetry, transitions
from ..agents import share_key
from ..catalog import model_info
from ..clients import ModelError, ModelRequest, ModelResponse, RateLimited, StreamAborted
from ..conf import agentrun_settings
from ..events import payloads
from ..exceptions import stopping_cause
from ..failpoints import failpoint
from ..models import ToolCall, Turn, idempotency_key_for
from ..servertools import connector_servers
from ..states import TOOL_CALL_CLOSED, ResultSource, SideEffect, ToolCallState, TurnState
from ..store import Write
from ..tools import ToolArgumentsError, arguments_hash
from . import guards
from .follows import At, Ended, commit_of
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
from .limits import parked
from .step import Commit, Step

logger = logging.getLogger(__name__)


def ask(step: Step, turn: Turn) -> Commit:
    """Ask the model for this turn's answer; the commit that records it."""
    try:
        req = request(step, turn)
        deltas = (
            streams.TurnStream(step.publisher, step.run, turn.index) if step.publisher else None
        )
        response, retries = call_model(step, req, deltas=deltas)
    except StreamAborted:
        return commit_of(step, step.write(), At.ANSWER, Ended.STREAM_ABORTED)
    except RateLimited as exc:
        # Nothing answered, nothing paid: the run waits out the limit parked, not here.
        return parked(step, turn, exc)
    except ModelError as exc:
        code, message = model_failure(exc)
        failed = {"code": code, "message": message[:2000], "phase": "model"}
        return commit_of(step, step.write(), At.ANSWER, Ended.MODEL_FAILED, **failed)
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - deterministic: the same request fails again
        stopping = stopping_cause(exc)
        if stopping is not None:
            # The process is being stopped (a pool child terminated by Celery after its
            # broker connection was lost raises SystemExit wherever it is; pydantic-core
            # wraps it in a SchemaError when it lands in the SDK's lazy model build): not
            # the request's fault. Stop; the run is recovered from its lease.
            raise stopping from exc
        # The request could not be built or sent (a value the SDK cannot encode, a client
        # bug): recovering would only repeat it, so the run fails at once, saying so.
        logger.exception("Model request failed run_id=%s", step.run_id)
        message = f"The request to the model could not be built or sent: {describe(exc)}"
        failed = {"code": "model_request_failed", "message": message[:2000], "phase": "model"}
        return commit_of(step, step.write(), At.ANSWER, Ended.REQUEST_FAILED, **failed)
    if step.failpoints:
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
    if "mcp_servers" in options:  # the MCP connector: each owner's token, never stored
        connectors = step.agent.mcp_connectors if step.agent is not None else {}
        owner = run.owner if run.owner_id is not None else None
        options["mcp_servers"] = connector_servers(options["mcp_servers"], connectors, owner)
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
    if any(has_thinking(m["content"]) for m in messages if m["role"] == "assistant"):
        info = model_info(config.model)  # whether the model checks a block's prefix
        messages = keep_valid_thinking(
            messages,
            origins,
            model=config.model,
            system=system,
            tools=tools,
            preserved=info.preserved_thinking if info is not None else True,
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
        admission=admission(step),  # the governor's fair share reads who it is for
    )


def admission(step: Step) -> dict[str, Any]:
    """Who a request is for, as the governor's fair share reads it: the run, and the key it
    was created with (Run.share_key; named again for a run made before it was kept); and
    `previous`: the usage of the run's last answer while its cache entries live (the
    governor learns from it what of the prompt is cached: clients/estimate.py)."""
    run = step.run
    found: dict[str, Any] = {"run": run, "key": run.share_key or share_key(run)}
    last = step.turns[-1] if step.turns else None
    if last is not None and last.content:
        # The cache entry lives its TTL from the request that last used it (the turn's).
        ttl = 3600 if step.config.cache_ttl == "1h" else 300
        if (timezone.now() - last.started_at).total_seconds() < ttl:
            found["previous"] = {
                "input_tokens": last.input_tokens,
                "cache_creation_input_tokens": last.cache_creation_input_tokens,
                "cache_read_input_tokens": last.cache_read_input_tokens,
            }
    return found


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
                results=[
                    c.tool_result_block() for c in step.calls_of(t) if c.state in TOOL_CALL_CLOSED
                ],
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
        if step.before_effect():  # a late process takes its lease back first
            raise StreamAborted(step.abort.reason)
        sent = req if deltas is None else replace(req, on_event=deltas.attempt(attempt))
        try:
            return complete(step.client.create(sent, abort=step.abort)), attempt
        except ModelError as exc:
            if exc.retryable and (isinstance(exc, RateLimited) or exc.status in (429, 529)):
                # The account's limit or the API's overload: never waited out in the slot,
                # the run is parked and asks again later (a retry all the same). A 429 the
                # API says not to retry (the spend cap) is final: it fails below.
                telemetry.model_retry(exc.status, req.model, parked=True)
                raise exc if isinstance(exc, RateLimited) else _rate_limited(exc) from exc
            if not exc.retryable or attempt == retries:
                raise
            base = agentrun_settings.MODEL_RETRY_BASE_SECONDS * (2**attempt)
            delay = min(
                max(exc.retry_after or 0.0, base), agentrun_settings.MODEL_RETRY_MAX_SECONDS
            )
            delay *= 1 + random.random() * 0.1
            telemetry.model_retry(exc.status, req.model)
            logger.warning(
                "Model call failed (status=%s), retrying in %.1fs run_id=%s",
                exc.status,
                delay,
                step.run_id,
            )
            if step.abort.wait(delay):
                raise StreamAborted(step.abort.reason) from exc
    raise AssertionError("unreachable")


def _rate_limited(exc: ModelError) -> RateLimited:
    return RateLimited(
        str(exc),
        retryable=True,
        status=exc.status,
        retry_after=exc.retry_after,
        request_id=exc.request_id,
    )


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
    stop = response.stop_reason or ""
    # A refused answer is paid for as the docs bill it (guards.refusal_billed).
    charged = stop != "refusal" or guards.refusal_billed(response.content, response.stop_details)
    cost = guards.price(step.prices, billed) if charged else guards.price(None, billed)
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
        message = (
            "The model returned tool_use blocks with missing, duplicate or reused ids; the "
            "response was recorded (and paid for) but not used."
        )
        failed = {"code": "invalid_model_output", "message": message, "phase": "model"}
        return commit_of(step, write, At.ANSWER, Ended.UNUSABLE_IDS, turn=turn, **failed)
    calls = intents(step, write, turn, blocks, truncated_id, refused=stop == "refusal")
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
        message = "The conversation no longer fits the model's context window."
        failed = {"code": "context_window_exceeded", "message": message, "phase": "model"}
        return commit_of(step, write, At.ANSWER, Ended.CONTEXT_EXCEEDED, turn=turn, **failed)
    ended, refusal = _answered(step, turn, calls, stop, response)
    if refusal is not None:
        refusal["billed"] = charged
    ctx = {"turn": turn, "stop_reason": stop, "refusal": refusal}
    return commit_of(step, write, At.ANSWER, ended, ("model.after_commit", None), **ctx)


def _answered(
    step: Step, turn: Turn, calls: list[ToolCall], stop: str, response: ModelResponse
) -> tuple[Ended, dict[str, Any] | None]:
    """What the answer ended with (step.FOLLOWS says what follows it), and its refusal.

    A refused answer ends the run whatever it streamed before the refusal (ARCHITECTURE.md
    invariant 11): its calls were closed as not run (`intents`), and the conversation goes
    on from before it (history.build_messages leaves it out): "you must reset the
    conversation context by removing or updating the turn that was refused before
    continuing" (https://platform.claude.com/docs/en/test-and-evaluate/strengthen-guardrails/handle-streaming-refusals),
    and its partial output is incomplete and discarded (history.final_output;
    https://platform.claude.com/docs/en/build-with-claude/refusals-and-fallback)."""
    if stop == "refusal":
        # The model that answered (the API may have fallen back to another) and why.
        refusal = {"model": response.model, **(response.stop_details or {})}
        refusal.pop("type", None)
        refusal["left_out_of_history"] = True
        return Ended.ANSWERED, refusal
    if any(c.state not in TOOL_CALL_CLOSED for c in calls):
        return Ended.CALLS_OPEN, None
    if calls:
        return Ended.CALLS_CLOSED, None
    if turn.is_final:
        return Ended.FINAL_TURN, None
    continued = stop == "max_tokens" and step.config.continue_on_max_tokens
    if stop in ("pause_turn", "compaction") or continued:
        # The API paused its own loop (server tools) or stopped after compacting: the next
        # turn sends this content back as the last message and the API goes on from it.
        return Ended.PAUSED, None
    return Ended.ANSWERED, None


def describe(value: Any) -> str:
    """An exception as the run's error message: its type and its text."""
    return f"{type(value).__name__}: {value}" if str(value) else type(value).__name__


# -- the answer's tool calls: intents, and the guards on them --------------------------

TRUNCATED = (
    "This tool call was cut off by the max_tokens limit, so its arguments are incomplete; it "
    "was not run. Make the call again with shorter arguments."
)
FINAL_TURN = (
    "Not run: the turn limit of this run is reached and no more tools may be called. Answer "
    "with what you have."
)
REFUSED = (
    "Not run: the answer that asked for this call ended in a refusal (stop_reason "
    "refusal), so nothing in it was run and it is left out of the conversation."
)


def intents(
    step: Step,
    write: Write,
    turn: Turn,
    blocks: list[dict[str, Any]],
    truncated_id: str | None,
    *,
    refused: bool = False,
) -> list[ToolCall]:
    """The calls of `turn`, built (added with the answer); their events recorded. The calls
    of a `refused` answer close at once, not run."""
    config, run = step.config, step.run
    cap = config.max_tool_calls_per_turn
    threshold = config.repeat_threshold
    window = config.repeat_window
    history = [c.arguments_hash for c in step.all_calls()]
    calls: list[ToolCall] = []
    now = timezone.now()
    for position, block in enumerate(blocks):
        name = str(block.get("name", ""))
        raw = block.get("input") if isinstance(block.get("input"), dict) else {}
        if refused:
            state, error, arguments = ToolCallState.SKIPPED, REFUSED, raw
        else:
            state, error, arguments = _guard(
                step, turn, block, name, raw, position, cap, truncated_id
            )
        digest = arguments_hash(name, arguments)
        looped = state == ToolCallState.REQUESTED and guards.repeated(
            history, digest, threshold, window
        )
        if looped:
            state = ToolCallState.SKIPPED
            error = (
                f"Not run: this is the {threshold}th identical call of {name} with the same "
                f"arguments within the last {max(window, threshold)} calls. Repeating it "
                "will not help; try a different strategy or answer with what you have."
            )
        history.append(digest)
        tool = step.tool(name)
        call = ToolCall(
            run=run,
            turn=turn,
            turn_index=turn.index,
            tool_call_id=str(block.get("id", "")),
            position=position,
            name=name,
            arguments=arguments,
            arguments_hash=digest,
            side_effect=tool.side_effect if tool else SideEffect.READ_ONLY,
            idempotency_key=idempotency_key_for(run.pk, str(block.get("id", ""))),
            state=state,
            created_at=now,
        )
        if looped:
            write.record(payloads.loop_detected(call, threshold))
        write.record(payloads.tool_call_requested(call))
        if error is not None:
            call.result, call.is_error, call.result_source, call.finished_at = (
                error,
                True,
                ResultSource.SYNTHETIC,
                now,
            )
            write.record(payloads.intercepted(call))
        calls.append(call)
    return calls


def _guard(
    step: Step,
    turn: Turn,
    block: dict[str, Any],
    name: str,
    raw: dict[str, Any],
    position: int,
    cap: int,
    truncated_id: str | None,
) -> tuple[str, str | None, dict[str, Any]]:
    """(state, synthetic error or None, canonical arguments) of one tool_use block."""
    tool = step.tool(name)
    if block.get("id") == truncated_id:
        return ToolCallState.ERRORED, TRUNCATED, raw
    if turn.is_final:
        return ToolCallState.SKIPPED, FINAL_TURN, raw
    if tool is None:
        names = [*(step.agent.tools if step.agent else ()), *step.config.mcp_tools]
        available = ", ".join(names) if names else "none"
        return ToolCallState.ERRORED, f"Unknown tool {name!r}. Available tools: {available}.", raw
    if position >= cap:
        return (
            ToolCallState.SKIPPED,
            f"Not run: at most {cap} tool calls are allowed per turn "
            f"(max_tool_calls_per_turn); this was call {position + 1}.",
            raw,
        )
    try:
        return ToolCallState.REQUESTED, None, tool.validate(raw)
    except ToolArgumentsError as exc:
        return (
            ToolCallState.ERRORED,
            f"{exc} The tool was not run; fix the arguments and try again.",
            raw,
        )
