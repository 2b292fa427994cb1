"""Tool-call intents and the guards on them: one ToolCall per tool_use block of an answer.
A call a guard intercepts (cut off by max_tokens, the final turn, an unknown tool, over
the per-turn cap, bad arguments, a repeated identical call) closes at once with a
synthetic is_error result the model can act on; the others wait in `requested`."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from ..events import payloads
from ..models import ToolCall, Turn, idempotency_key_for
from ..states import ResultSource, SideEffect, ToolCallState
from ..store import Write
from ..tools import ToolArgumentsError, arguments_hash
from . import guards
from .step import Step

TRUNCATED = (
    "This tool call was cut off by the max_tokens limit, so its arguments are incomplete; it "
    "was not run. Make the call again with shorter arguments."
)
FINAL_TURN = (
    "Not run: the turn limit of this run is reached and no more tools may be called. Answer "
    "with what you have."
)


def intents(
    step: Step, write: Write, turn: Turn, blocks: list[dict[str, Any]], truncated_id: str | None
) -> list[ToolCall]:
    """The calls of `turn`, built (added with the answer); their events recorded."""
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
        state, error, arguments = _guard(step, turn, block, name, raw, position, cap, truncated_id)
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
        agent = step.agent
        available = ", ".join(agent.tools) if agent and agent.tools else "none"
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
