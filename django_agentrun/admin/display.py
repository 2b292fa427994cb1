"""How the admin shows things: state badges, pretty JSON, one-line summaries, links."""

from __future__ import annotations

import json
from typing import Any

from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import Run, RunEvent, ToolCall, Turn
from ..states import RunState, ToolCallState, TurnState

# Badge colours, one per state value (a guard test checks every member is covered).
RUN_STATE_COLOURS: dict[str, str] = {
    RunState.QUEUED: "#6c757d",
    RunState.RUNNING: "#0d6efd",
    RunState.AWAITING_TOOL: "#138496",
    RunState.AWAITING_APPROVAL: "#d9480f",
    RunState.COMPLETED: "#198754",
    RunState.FAILED: "#dc3545",
    RunState.CANCELLED: "#495057",
    RunState.TIMED_OUT: "#6f42c1",
}
TURN_STATE_COLOURS: dict[str, str] = {
    TurnState.RUNNING: "#0d6efd",
    TurnState.AWAITING_TOOL: "#138496",
    TurnState.COMPLETED: "#198754",
    TurnState.CANCELLED: "#495057",
    TurnState.FAILED: "#dc3545",
}
TOOL_CALL_STATE_COLOURS: dict[str, str] = {
    ToolCallState.REQUESTED: "#6c757d",
    ToolCallState.AWAITING_APPROVAL: "#d9480f",
    ToolCallState.IN_FLIGHT: "#0d6efd",
    ToolCallState.UNKNOWN: "#c2255c",
    ToolCallState.SUCCEEDED: "#198754",
    ToolCallState.ERRORED: "#dc3545",
    ToolCallState.REJECTED: "#a61e4d",
    ToolCallState.SKIPPED: "#868e96",
    ToolCallState.CANCELLED: "#495057",
}
_COLOURS = {
    Run: (RUN_STATE_COLOURS, RunState),
    Turn: (TURN_STATE_COLOURS, TurnState),
    ToolCall: (TOOL_CALL_STATE_COLOURS, ToolCallState),
}


def state_badge(obj: Run | Turn | ToolCall) -> SafeString:
    colours, choices = _COLOURS[type(obj)]
    return format_html(
        '<span class="agentrun-badge" style="background:{};color:#fff;padding:2px 8px;'
        'border-radius:10px;font-size:11px;font-weight:600;white-space:nowrap;">{}</span>',
        colours.get(obj.state, "#343a40"),
        choices(obj.state).label if obj.state in choices.values else obj.state,
    )


def json_text(value: Any) -> str:
    """Pretty JSON; a string that holds JSON (a tool result) is pretty-printed too."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if not isinstance(parsed, (dict, list)):
            return value
        value = parsed
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def pretty_json(value: Any, limit: int | None = None) -> SafeString:
    """Escaped, pretty-printed JSON in a <pre>, optionally cut at `limit` characters."""
    if value is None:
        return format_html('<span class="quiet">{}</span>', "—")
    text = json_text(value)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "\n…"
    return format_html(
        '<pre class="agentrun-json" style="margin:0;white-space:pre-wrap;word-break:break-word;">'
        "{}</pre>",
        text,
    )


def summary(payload: Any, limit: int = 160) -> str:
    """`payload` as one line of JSON, cut at `limit` characters."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def change_url(obj: Run | ToolCall) -> str:
    return reverse(f"admin:agentrun_{obj._meta.model_name}_change", args=[obj.pk])


def run_link(obj: ToolCall | RunEvent) -> SafeString:
    """A link to the run of `obj` (a tool call or an event): "agent · short id"."""
    return format_html(
        '<a href="{}">{} · {}</a>', change_url(obj.run), obj.run.agent, str(obj.run_id)[:8]
    )
