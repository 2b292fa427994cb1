"""The conversation sent to the model, built from recorded turns (rows or events).

Both the engine (from rows) and the projection (from events) call `build_messages`,
so "the history the model sees" has one definition. A run of a conversation starts with
what its earlier runs contribute (`Segment`s, read from their rows at the claim).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema

from ..states import TOOL_CALL_CLOSED

if TYPE_CHECKING:
    from ..clients import ModelError


@dataclass
class TurnRecord:
    """What one turn contributes: the assistant content and its tool results in order."""

    index: int
    content: list[dict[str, Any]] | None
    results: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    prefix: str = ""  # what the answer was written after (prefix_hash), if it has thinking

    @property
    def cut_off(self) -> bool:
        """A text answer cut off at max_tokens: a turn after it continues it."""
        return self.stop_reason == "max_tokens" and not self.results and bool(self.content)

    @property
    def final(self) -> bool:
        """A final answer: a turn after it (a run resumed after invalid_structured_output)
        follows the resume notice."""
        return self.stop_reason in FINAL and not self.results and bool(self.content)


# Between an answer cut off at max_tokens and the turn that continues it (an Agent with
# continue_on_max_tokens): a user message, valid for every model (current models refuse an
# assistant prefill), kept in the history like the turns around it.
CONTINUE_NOTICE = (
    "Your previous answer was cut off by the output token limit. Continue exactly where it "
    "stopped, without repeating anything."
)


# After a final answer that could not be used (a run resumed after
# invalid_structured_output): a user message, since current models refuse a request that
# ends with an assistant message (a prefill; "Prefill removal",
# https://platform.claude.com/docs/en/about-claude/models/whats-new-claude-4-6). Kept in the
# history like the turns around it: the turn answered after it was written after it.
FINAL = ("end_turn", "stop_sequence")  # what a final answer's stop_reason is

RESUME_NOTICE = (
    "Your previous answer could not be used as the final answer: it did not follow the "
    "required output format. Answer again, following it exactly."
)


@dataclass
class Segment:
    """What an earlier run of a conversation contributes to a later run's history: its
    input and context, then its turns (a rolled-back run contributes nothing)."""

    input: Any
    context: str = ""
    turns: Sequence[TurnRecord] = ()


def segments(runs: Iterable[Any], turns: Iterable[Any], calls: Iterable[Any]) -> list[Segment]:
    """What each earlier run of a conversation contributes (rows read at the claim, once
    per task), its turns' results rendered once."""
    by_turn: dict[tuple[Any, int], list[Any]] = {}
    for call in calls:
        by_turn.setdefault((call.run_id, call.turn_index), []).append(call)
    records: dict[Any, list[TurnRecord]] = {}
    for turn in turns:
        results = [
            c.tool_result_block()
            for c in by_turn.get((turn.run_id, turn.index), ())
            if c.state in TOOL_CALL_CLOSED
        ]
        records.setdefault(turn.run_id, []).append(
            TurnRecord(turn.index, turn.content, results, turn.stop_reason, turn.prefix)
        )
    return [Segment(r.input, r.context, records.get(r.pk, [])) for r in runs]


def user_message(input: Any, context: str = "") -> dict[str, Any]:
    """The input as a user message; a message's context follows it as a text block."""
    if not context:
        return {"role": "user", "content": input}
    return {"role": "user", "content": [*blocks(input), {"type": "text", "text": context}]}


def build_messages(
    input: Any,
    turns: Iterable[TurnRecord],
    *,
    context: str = "",
    earlier: Iterable[Segment] = (),
    origins: dict[int, tuple[dict[str, Any], TurnRecord]] | None = None,
) -> list[dict[str, Any]]:
    """What each earlier run of the conversation contributes, then this run's: the user
    input (and context), then per recorded turn the assistant message and, if it asked
    for tools, one user message whose content starts with every tool_result in order.

    Consecutive user messages become one, in order: a run's last tool results (or the
    input of a run that ended before its first answer), then the next run's input. So the
    results of a tool_use always come first in the next user message.

    An earlier run that ended right after a turn paused with `pause_turn` (cancelled,
    interrupted, timed out, at its final turn) left a server_tool_use unanswered: it is
    left out (`close_paused`), so the next user message is valid; `origins`, if given,
    maps each assistant message's id to it and its TurnRecord."""
    messages: list[dict[str, Any]] = []
    for segment in earlier:
        _add(messages, without_breakpoints(segment.input), segment.context, segment.turns, origins)
        close_paused(messages)
    _add(messages, input, context, turns, origins)
    return messages


def _add(
    messages: list[dict[str, Any]],
    input: Any,
    context: str,
    turns: Iterable[TurnRecord],
    origins: dict[int, tuple[dict[str, Any], TurnRecord]] | None = None,
) -> None:
    add_user(messages, user_message(input, context))
    before: TurnRecord | None = None
    for turn in sorted(turns, key=lambda t: t.index):
        if not turn.content:
            continue  # no response recorded (cancelled or failed before it)
        if before is not None and before.cut_off:
            add_user(messages, user_message(CONTINUE_NOTICE))
        elif before is not None and before.final:
            add_user(messages, user_message(RESUME_NOTICE))
        else:
            # A paused turn is continued by an answer holding its results: not one sent
            # after the final-turn notice (a user message then, not kept in the history).
            close_paused(messages, answered=_answered(turn.content))
        message = {"role": "assistant", "content": turn.content}
        messages.append(message)
        if origins is not None:
            origins[id(message)] = (message, turn)
        if turn.results:
            messages.append({"role": "user", "content": list(turn.results)})
        before = turn


def _answered(content: Any) -> set[Any]:
    return {b.get("tool_use_id") for b in content if isinstance(b, dict)}


def close_paused(messages: list[dict[str, Any]], answered: set[Any] = frozenset()) -> None:  # type: ignore[assignment]
    """Before a user message follows: the last assistant message without the server_tool_use
    blocks it left unanswered (a turn paused with `pause_turn`, never continued), but those
    `answered` by what follows. The API answers them only when the paused turn is sent back
    as the last message; followed by anything else, an open server_tool_use is refused (a
    v0.3.0 conversation broken that way is repaired here, when it is read). A message left
    empty goes."""
    if not messages or messages[-1]["role"] != "assistant":
        return
    content = messages[-1]["content"]
    if not isinstance(content, list):
        return
    answered = _answered(content) | set(answered)
    kept = [
        b
        for b in content
        if not (b.get("type") == "server_tool_use" and b.get("id") not in answered)
    ]
    if len(kept) == len(content):
        return
    if kept:
        messages[-1]["content"] = kept  # the same message (built here): its origin holds
    else:
        messages.pop()


THINKING_BLOCKS = ("thinking", "redacted_thinking")


def _canonical(value: Any) -> bytes:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    if '"cache_control"' in text:  # rare (a run's input, a tool result): copied without
        value = _without_markers(value)
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode()


def _without_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def _prefix_digest(model: str, system: Any, tools: Any) -> Any:
    digest = hashlib.sha256(_canonical({"model": model, "system": system, "tools": tools}))
    digest.update(b"\0")
    return digest


def prefix_hash(model: str, system: Any, tools: Any, messages: Sequence[dict[str, Any]]) -> str:
    """What a request's answer is written after, as one value: the model, the system prompt,
    the tools and the messages (cache_control markers aside). A thinking block in the answer
    stays valid while the messages before it hash to the same."""
    digest = _prefix_digest(model, system, tools)
    for message in messages:
        digest.update(_canonical(message) + b"\0")
    return digest.hexdigest()


def has_thinking(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") in THINKING_BLOCKS for b in content
    )


def keep_valid_thinking(
    messages: list[dict[str, Any]],
    origins: dict[int, tuple[dict[str, Any], TurnRecord]],
    *,
    model: str,
    system: Any,
    tools: Any,
) -> list[dict[str, Any]]:
    """`messages` with every thinking block the API would refuse left out.

    A thinking block is valid only after exactly what preceded it when the model wrote it
    (system, tools, every earlier message) and on that model; once one is not, every later
    one is not either (https://platform.claude.com/docs/en/build-with-claude/preserved-thinking).
    History changes after the fact: a replaced tool result, a fork of another config, a
    rolled-back run, a follow-up on another model, a paused turn closed. Each turn keeps the
    hash of what it was written after (`prefix_hash`); here the messages before each
    assistant message are hashed again, and where they differ its thinking blocks are left
    out, in the open tool-use loop too: the request is then what the API itself sends on
    with `prefix_mismatch_behavior: "drop_block"` (the blocks dropped, the request answered).
    Every later block differs with it, except one written after the change (its own prefix
    already without it). A turn recorded before the hash was kept (empty `prefix`) is
    trusted until the first block left out."""
    if not any(has_thinking(m["content"]) for m in messages if m["role"] == "assistant"):
        return messages
    digest = _prefix_digest(model, system, tools)
    changed = False
    out = []
    for message in messages:
        origin = origins.get(id(message))
        record = origin[1] if origin is not None and origin[0] is message else None
        if message["role"] == "assistant" and has_thinking(message["content"]):
            if record is not None and record.prefix:
                # Written after what precedes it now (even after a block left out): valid.
                drop = digest.hexdigest() != record.prefix
            else:
                drop = changed
            changed = changed or drop
            if drop:
                kept = [b for b in message["content"] if b.get("type") not in THINKING_BLOCKS]
                message = {**message, "content": kept or [{"type": "text", "text": "..."}]}
        out.append(message)
        digest.update(_canonical(message) + b"\0")
    return out


def add_user(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append a user message, merged into the last one if that is a user message too."""
    if messages and messages[-1]["role"] == "user":
        last = messages[-1]["content"]
        messages[-1] = {"role": "user", "content": [*blocks(last), *blocks(message["content"])]}
    else:
        messages.append(message)


def blocks(content: Any) -> list[Any]:
    """Message content as a list of blocks (a string is one text block)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def without_breakpoints(input: Any) -> Any:
    """An earlier run's input without its cache_control: a breakpoint is its own request's
    (the API takes 4 a request, and every later message of a conversation would add more)."""
    if not isinstance(input, list):
        return input
    return [
        {k: v for k, v in block.items() if k != "cache_control"}
        if isinstance(block, dict)
        else block
        for block in input
    ]


def sanitize_content(content: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content as it can be sent back: no blank text blocks, tool_use input always an object."""
    clean: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text" and not str(block.get("text") or "").strip():
            continue  # the API rejects empty and whitespace-only text blocks
        if kind == "tool_use" and not isinstance(block.get("input"), dict):
            block = {**block, "input": {}}
        clean.append(block)
    return clean


def final_output(
    turns: Sequence[Any], has_calls: Any, refusal: dict[str, Any] | None
) -> dict[str, Any]:
    """A completed run's output: the text of its last answer (with the text of the answers
    cut off at max_tokens that it continued, joined before it), its content, a refusal."""
    answered = [t for t in turns if t.content]
    final = answered[-1] if answered else None
    parts = answered[-1:]
    for earlier in reversed(answered[:-1]):
        if earlier.stop_reason != "max_tokens" or has_calls(earlier):
            break
        parts.insert(0, earlier)
    output: dict[str, Any] = {
        "text": "".join(text_of(t.content) for t in parts),
        "content": final.content if final else [],
    }
    if refusal is not None:
        output["refusal"] = refusal
    return output


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


def text_of(content: Sequence[dict[str, Any]] | None) -> str:
    return "".join(block.get("text", "") for block in content or () if block.get("type") == "text")


# What a 400 says when the API refuses something in the conversation rather than the
# request's fixed parts (model, tools, limits: those fail on the first turn already):
# a path into `messages`, content it could not use ("Could not process image", "Unable
# to download the file" for a URL source), or too many cache_control breakpoints.
_ABOUT_HISTORY = re.compile(
    r"\bmessages\b|tool_use|tool_result|\bimage\b|\bdocument\b|\bpdf\b|unable to download"
    r"|cache_control",
    re.I,
)


def model_failure(exc: ModelError) -> tuple[str, str]:
    """The run's error code and message for a model call that failed for good.

    `history_rejected`: the API refused the recorded history itself (a 400 about it, or
    413: the request outgrew the size limit, and only the history grows). Sending it
    again cannot help, so the run fails with a code that says so; a person repairs the
    offending tool result (services.replace_tool_result) and resumes the run."""
    if exc.retryable:
        return "model_unavailable", str(exc)
    if exc.status == 413 or (exc.status == 400 and _ABOUT_HISTORY.search(str(exc))):
        return (
            "history_rejected",
            "The Messages API refused the run's history; resuming would send it again, so "
            f"replace the offending tool result first (replace_tool_result). The API said: {exc}",
        )
    return "model_error", str(exc)
