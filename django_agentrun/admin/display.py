"""How the admin shows things: state badges, JSON and text a page can always carry, large
values folded, one date format, one-line summaries, links.

A run may hold anything JSON can: NUL characters, lone surrogates (undecodable bytes a
tool returned), megabytes of input, HTML in the model's words. Every value goes through
`printable` (escapes for what a UTF-8 page cannot carry) and Django's autoescaping, and
large ones are folded: the page shows the start and links to the whole value as text.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import format_html, format_html_join
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

#: The one date format of the admin's pages (local time).
DATE_FORMAT = "Y-m-d H:i:s"
#: Characters of a value shown before it is folded (the rest behind "show all"): in the
#: conversation, and where a page shows one value in its own field.
FOLD_CHARS = 3000
FIELD_FOLD_CHARS = 20_000

_UNPRINTABLE = re.compile("[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` as a UTF-8 page can carry it: lone surrogates (`\\udcff`) and control
    characters such as NUL (`\\x00`) written as escapes; newlines and tabs kept."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"


def state_badge(obj: Run | Turn | ToolCall) -> SafeString:
    """The state as the API spells it (`awaiting_approval`), coloured; its label on hover."""
    colours, choices = _COLOURS[type(obj)]
    label = choices(obj.state).label if obj.state in choices.values else obj.state
    return format_html(
        '<span class="agentrun-badge" style="background:{};color:#fff;padding:2px 8px;'
        'border-radius:10px;font-size:11px;font-weight:600;white-space:nowrap;" title="{}">'
        "{}</span>",
        colours.get(obj.state, "#343a40"),
        label,
        obj.state,
    )


def when(value: datetime | None) -> str:
    """A time in the admin's one format (local time), or a dash."""
    if value is None:
        return "—"
    return format_date(
        timezone.localtime(value) if timezone.is_aware(value) else value, DATE_FORMAT
    )


def json_text(value: Any) -> str:
    """Pretty JSON, printable; a string that holds JSON (a tool result) is pretty-printed
    too, any other string is shown as it is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return printable(value)
        if not isinstance(parsed, (dict, list)):
            return printable(value)
        value = parsed
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except RecursionError:  # deeper than the pretty printer goes: compact, or nothing
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except RecursionError:
            text = "(nested too deeply to show)"
    return printable(text)


def size(chars: int) -> str:
    for unit, scale in (("MB", 1_000_000), ("kB", 1_000)):
        if chars >= scale:
            return f"{chars / scale:.1f} {unit}"
    return f"{chars} characters"


def folded_text(
    text: str, url: str | None = None, *, limit: int = FOLD_CHARS, css: str = "agentrun-json"
) -> SafeString:
    """Printable `text` in a <pre> (of class `css`), its start only when it is longer than
    `limit`, with a link to the whole of it (`url`, a value view) instead of the rest."""
    if len(text) <= limit:
        return format_html('<pre class="{}">{}</pre>', css, text)
    more = format_html(
        '<span class="agentrun-fold">… {} more ({} in all).{}</span>',
        f"{len(text) - limit:,} characters",
        size(len(text)),
        format_html(' <a href="{}" target="_blank" rel="noopener">Show all</a>', url)
        if url
        else "",
    )
    return format_html('<pre class="{}">{}</pre>{}', css, text[:limit], more)


def pretty_json(value: Any, limit: int | None = None, url: str | None = None) -> SafeString:
    """Escaped, pretty-printed JSON in a <pre>, folded past `limit` characters (with a link
    to `url`, the whole value); a dash for None."""
    if value is None:
        return format_html('<span class="quiet">{}</span>', "—")
    return folded_text(json_text(value), url, limit=limit or FOLD_CHARS)


def cut(text: str, limit: int) -> str:
    """One printable line of `text`, at most `limit` characters."""
    line = " ".join(printable(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def input_summary(value: Any, limit: int = 80) -> str:
    """A run's input on one line: its text (and the kinds of its other blocks)."""
    if isinstance(value, str):
        return cut(value, limit)
    if isinstance(value, list):
        parts = []
        for block in value:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'block')}]")
        return cut(" ".join(parts), limit)
    return cut(summary(value), limit)


def argument_lines(arguments: Any, per_value: int = 90, keys: int = 8) -> SafeString:
    """Each argument on its own line, its value cut on its own: a long value cannot push
    another argument out of view. Past `keys` arguments, how many more there are."""
    if not isinstance(arguments, dict):
        return format_html(
            '<span class="agentrun-args">{}</span>', cut(summary(arguments), per_value)
        )
    items = list(arguments.items())
    lines = format_html_join(
        "",
        '<div><span class="agentrun-key">{}</span>: {}</div>',
        ((cut(str(key), 40), cut(summary(value), per_value)) for key, value in items[:keys]),
    )
    if len(items) > keys:
        lines = format_html('{}<div class="quiet">… {} more</div>', lines, len(items) - keys)
    return format_html('<div class="agentrun-args">{}</div>', lines)


def summary(payload: Any, limit: int = 160) -> str:
    """`payload` as one printable line of JSON, cut at `limit` characters."""
    if isinstance(payload, str):
        text = payload
    else:
        try:
            text = json.dumps(payload, ensure_ascii=False, default=str)
        except RecursionError:
            text = "(nested too deeply to show)"
    return cut(text, limit)


def change_url(obj: Run | ToolCall | RunEvent) -> str:
    return reverse(f"admin:agentrun_{obj._meta.model_name}_change", args=[obj.pk])


def value_url(obj: Run | ToolCall | RunEvent, name: str) -> str:
    """The whole of a value of `obj` as text (the "show all" of a folded value)."""
    return reverse(f"admin:agentrun_{obj._meta.model_name}_value", args=[obj.pk, name])


def run_link(obj: ToolCall | RunEvent) -> SafeString:
    """A link to the run of `obj` (a tool call or an event): "agent · short id"."""
    return format_html(
        '<a href="{}">{} · <span class="agentrun-nowrap">{}</span></a>',
        change_url(obj.run),
        obj.run.agent,
        str(obj.run_id)[:8],
    )
