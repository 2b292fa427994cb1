"""A run as a conversation, for the run's page and the decision page: the input, then per
turn the model's words, each tool call with its arguments, result and decision (who, why),
and what happened meanwhile (recoveries, cancels, resumes, guards), from the run's rows
and the events that say more. Everything is printable and large values are folded."""

from __future__ import annotations

import difflib
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..events import EventType
from ..models import Run, ToolCall
from ..servertools import SERVER_BLOCK_TYPES
from ..states import ToolCallState
from .display import (
    change_url,
    cut,
    folded_text,
    input_summary,
    json_text,
    pretty_json,
    printable,
    state_badge,
    summary,
    value_url,
    when,
)

PENDING = (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)
# Events worth a line in the conversation (the rest are in the event log).
NOTABLE = (
    EventType.RUN_CREATED,
    EventType.RECOVERY,
    EventType.REAPER_REQUEUED,
    EventType.TOOL_CALL_RECOVERED,
    EventType.TOOL_CALL_UNKNOWN,
    EventType.APPROVAL_REQUESTED,
    EventType.APPROVAL_DECIDED,
    EventType.TOOL_CALL_RESOLVED,
    EventType.TOOL_RESULT_REPLACED,
    EventType.LOOP_DETECTED,
    EventType.BUDGET_EXCEEDED,
    EventType.CANCEL_REQUESTED,
    EventType.RUN_CANCELLED,
    EventType.RUN_TIMED_OUT,
    EventType.RUN_RESUMED,
    EventType.RUN_FAILED,
)
WORDS = "agentrun-words"
# Summarized thinking: shown apart from (and quieter than) the answer.
THINKING = "agentrun-words agentrun-thinking"
# Which turn an event belongs to: the last one started before it.
_TURN_MARK = EventType.TURN_STARTED


def user_names(ids: set[Any]) -> dict[Any, str]:
    ids = {i for i in ids if isinstance(i, int)}
    users = get_user_model().objects.filter(pk__in=ids) if ids else []
    return {user.pk: user.get_username() for user in users}


def input_view(run: Run) -> list[SafeString]:
    """The run's input as a person reads it: its text, and a line per other block."""
    url = value_url(run, "input")
    if isinstance(run.input, str):
        return [folded_text(printable(run.input), url, css=WORDS)]
    if not isinstance(run.input, list):
        return [pretty_json(run.input, url=url)]
    shown = []
    for block in run.input:
        if isinstance(block, dict) and block.get("type") == "text":
            shown.append(folded_text(printable(str(block.get("text", ""))), url, css=WORDS))
        else:
            shown.append(format_html('<p class="quiet">{}</p>', _block_label(block)))
    return shown


def _block_label(block: Any) -> str:
    if not isinstance(block, dict):
        return cut(summary(block), 120)
    kind = block.get("type")
    if kind == "server_tool_use":  # run by the API itself: never a call of this app's
        return cut(
            f"[{block.get('name')}, run by the API: {input_summary(block.get('input'))}]", 160
        )
    if kind == "mcp_tool_use":  # run by the API's MCP connector, on the server it names
        return cut(
            f"[{block.get('name')} on {block.get('server_name')}, run by the API: "
            f"{input_summary(block.get('input'))}]",
            160,
        )
    if kind == "mcp_tool_listing":  # what the API listed; later requests reuse it
        names = ", ".join(str(t.get("name")) for t in block.get("tools") or ())
        return cut(
            f"[tools of {block.get('mcp_server_name')}, as the API listed them: {names}]", 160
        )
    if kind in SERVER_BLOCK_TYPES:
        content = block.get("content")
        if isinstance(content, list):
            detail = f"{len(content)} result{'s' if len(content) != 1 else ''}"
        elif isinstance(content, dict):
            error = content.get("error_code")
            code = content.get("return_code")
            detail = (
                f"error {error}" if error else f"return code {code}" if code is not None else ""
            )
        else:
            detail = ""
        return cut(f"[{kind}{': ' + detail if detail else ''}]", 160)
    if kind == "compaction":
        return cut(f"[compaction: {block.get('content') or 'failed, no summary'}]", 300)
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    detail = source.get("media_type") or source.get("url") or source.get("type") or ""
    return cut(f"[{block.get('type', 'block')}{': ' + str(detail) if detail else ''}]", 120)


def words(turn: Any) -> list[SafeString]:
    """The model's words of a turn (its text blocks) and a line for each other kind of block."""
    shown = []
    url = value_url(turn.run, f"turn-{turn.index}")
    for block in turn.content or ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            shown.append(folded_text(printable(str(block.get("text", ""))), url, css=WORDS))
        elif kind == "thinking" and block.get("thinking"):
            # Summarized thinking, apart from the answer (signatures are never shown).
            shown.append(format_html('<p class="quiet">{}</p>', _("Thinking (summarized):")))
            shown.append(folded_text(printable(str(block["thinking"])), url, css=THINKING))
        elif kind in ("thinking", "redacted_thinking"):
            label = _("[thinking omitted]") if kind == "thinking" else _("[redacted thinking]")
            shown.append(format_html('<p class="quiet">{}</p>', label))
        elif kind != "tool_use":
            shown.append(format_html('<p class="quiet">{}</p>', _block_label(block)))
    return shown


def decision_line(call: ToolCall, names: dict[Any, str]) -> str:
    """Who decided on the call, when and why (empty if nobody did)."""
    if call.decided_at is None:
        if call.state == ToolCallState.AWAITING_APPROVAL:
            return "Waiting for approval."
        if call.state == ToolCallState.UNKNOWN:
            return "Outcome unknown: waiting for a person."
        return ""
    verb = "rejected" if call.state == ToolCallState.REJECTED else "decided"
    if call.approved and call.state != ToolCallState.REJECTED:
        verb = "approved" if call.result_source != "person" else "settled"
    who = names.get(call.decided_by_id, "the system") if call.decided_by_id else "the system"
    note = f": {cut(call.decision_note, 300)}" if call.decision_note else ""
    return f"{verb.capitalize()} by {who} at {when(call.decided_at)}{note}"


def call_view(call: ToolCall, names: dict[Any, str], current: Any = None) -> dict[str, Any]:
    return {
        "call": call,
        "url": change_url(call),
        "badge": state_badge(call),
        "arguments": pretty_json(call.arguments, limit=1500, url=value_url(call, "arguments")),
        "result": pretty_json(call.result, limit=1500, url=value_url(call, "result"))
        if call.result is not None
        else None,
        "decision": decision_line(call, names),
        "pending": call.state in PENDING,
        "current": call.pk == current,
    }


def note_text(kind: str, p: dict[str, Any], names: dict[Any, str]) -> str:
    """One line about a notable event, from its payload."""

    def who(key: str = "by") -> str:
        value = p.get(key)
        return names.get(value, f"user {value}") if value is not None else "the system"

    call = p.get("tool_call_id", "")
    texts = {
        EventType.RUN_CREATED: f"Forked from run {p.get('forked_from')} at turn "
        f"{p.get('forked_at_turn')} by {who('forked_by')}."
        if p.get("forked_from")
        else "",
        EventType.RECOVERY: "A worker took the run over from one that stopped renewing its "
        f"lease (recovery {p.get('attempts')}).",
        EventType.REAPER_REQUEUED: "The reaper sent the run back to the queue.",
        EventType.TOOL_CALL_RECOVERED: f"{call}: found in flight after a crash; tried again "
        f"({p.get('policy')}).",
        EventType.TOOL_CALL_UNKNOWN: f"{call}: outcome unknown after a crash: {p.get('reason')}",
        EventType.APPROVAL_REQUESTED: f"{call}: waits for a person's approval"
        + (f" until {p['deadline']}." if p.get("deadline") else "."),
        EventType.APPROVAL_DECIDED: f"{call}: {p.get('decision')} by {who()}"
        + (f": {p['note']}" if p.get("note") else "."),
        EventType.TOOL_CALL_RESOLVED: f"{call}: resolved ({p.get('decision')}) by {who()}"
        + (f": {p['note']}" if p.get("note") else "."),
        EventType.TOOL_RESULT_REPLACED: f"{call}: result replaced by {who()}"
        + (f": {p['note']}" if p.get("note") else "."),
        EventType.LOOP_DETECTED: f"{call}: the same {p.get('name')} call {p.get('count')} "
        "times; intercepted.",
        EventType.BUDGET_EXCEEDED: f"Budget {p.get('limit')}: {p.get('projected')} would pass "
        f"{p.get('allowed')}.",
        EventType.CANCEL_REQUESTED: f"Cancel requested by {who()}"
        + (f": {p['reason']}" if p.get("reason") else "."),
        EventType.RUN_CANCELLED: f"Cancelled: {p.get('reason') or 'no reason given'}.",
        EventType.RUN_TIMED_OUT: f"Timed out: {p.get('reason') or 'deadline passed'}.",
        EventType.RUN_RESUMED: f"Resumed by {who()} (it was {p.get('from')}).",
        EventType.RUN_FAILED: f"Failed: {p.get('error_code')} in {p.get('phase') or '?'}: "
        f"{p.get('error_message')}",
    }
    return cut(texts.get(kind, ""), 400)


def conversation(
    run: Run, *, upto: int | None = None, current: Any = None, last: int | None = None
) -> dict[str, Any]:
    """The context of `_conversation.html`: the input, the turns (up to turn `upto`; the
    `last` ones only, if given) with their calls and notes, and the notes from before the
    first turn."""
    turns = run.turns.order_by("index")
    calls = run.tool_calls.order_by("turn_index", "position")
    if upto is not None:
        turns, calls = turns.filter(index__lte=upto), calls.filter(turn_index__lte=upto)
    total = turns.count()
    if last is not None and total > last:
        first = total - last
        turns, calls = turns.filter(index__gte=first), calls.filter(turn_index__gte=first)
    turns, calls = list(turns), list(calls)
    events = list(
        run.events.filter(type__in=(*NOTABLE, _TURN_MARK))
        .order_by("seq")
        .only("type", "payload", "created_at")
    )
    ids = {c.decided_by_id for c in calls}
    for event in events:
        if isinstance(event.payload, dict):
            ids.update(event.payload.get(key) for key in ("by", "forked_by"))
    names = user_names(ids)
    notes: dict[int, list[dict[str, str]]] = {}
    at = -1
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.type == _TURN_MARK:
            at = payload.get("turn_index", at)
            continue
        text = note_text(event.type, payload, names)
        if text:
            notes.setdefault(at, []).append({"when": when(event.created_at), "text": text})
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        call.run = run
        by_turn.setdefault(call.turn_index, []).append(call_view(call, names, current))
    for turn in turns:
        turn.run = run
    return {
        "turns_total": total,
        "turns_cut": total > len(turns),
        "input": input_view(run),
        "input_json_url": value_url(run, "input"),
        "before": notes.get(-1, []),
        "turns": [
            {
                "turn": turn,
                "badge": state_badge(turn),
                "usage": turn.usage(),
                "started": when(turn.started_at),
                "finished": when(turn.finished_at) if turn.finished_at else "",
                "words": words(turn),
                "calls": by_turn.get(turn.index, []),
                "notes": notes.get(turn.index, []),
            }
            for turn in turns
        ],
    }


def arguments_diff(call: ToolCall) -> list[tuple[str, str]]:
    """The model's arguments against the ones a person approved, line by line: (kind, line)
    with kind "add", "del" or "" (empty if they were not edited)."""
    if call.original_arguments is None:
        return []
    before = json_text(call.original_arguments).splitlines()
    after = json_text(call.arguments).splitlines()
    lines = []
    for line in difflib.unified_diff(before, after, "model", "approved", lineterm="", n=2):
        kind = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        if line.startswith(("+++", "---", "@@")):
            kind = "meta"
        lines.append((kind, line))
    return lines
