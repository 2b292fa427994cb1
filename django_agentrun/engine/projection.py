"""Rebuild a run from its events alone (a pure function: no database).

Tests compare the projection with the rows of every run they create, which
proves the event log is complete (invariant 7). A run of a conversation names it and its
place in it (`run_created`); `project_conversation` rebuilds the history a run of it
starts with from the events of the earlier runs (a rolled-back one: `run_rolled_back`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..clients.base import USAGE_KEYS
from ..content import render_result
from ..events import EventType
from .history import Segment, TurnRecord, build_messages


@dataclass
class Projection:
    run_state: str | None = None
    turn_states: dict[int, str] = field(default_factory=dict)
    tool_call_states: dict[tuple[int, str], str] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    messages: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    error_code: str = ""
    last_seq: int = 0
    # A run of a conversation: which, where, its message's context, whether rolled back.
    conversation: str | None = None
    position: int | None = None
    context: str = ""
    rolled_back: bool = False
    segment: Segment | None = None  # what it contributes to the later runs' history


def project(events: Iterable[Any]) -> Projection:
    """Fold events (objects with .seq/.type/.payload, or (seq, type, payload) tuples) in seq order."""
    out = Projection()
    run_input: Any = None
    contents: dict[int, list[dict[str, Any]]] = {}
    stops: dict[int, str] = {}
    positions: dict[tuple[int, str], int] = {}
    results: dict[tuple[int, str], dict[str, Any]] = {}
    for seq, kind, payload in sorted(_triples(events), key=lambda e: e[0]):
        if seq != out.last_seq + 1:
            raise ValueError(f"Event seq gap: expected {out.last_seq + 1}, got {seq}")
        out.last_seq = seq
        if "run_state" in payload:
            out.run_state = payload["run_state"]
        if "turn_state" in payload:
            out.turn_states[payload["turn_index"]] = payload["turn_state"]
        key = (payload.get("turn_index"), payload.get("tool_call_id"))
        if "tool_call_state" in payload:
            out.tool_call_states[key] = payload["tool_call_state"]
        if kind == EventType.RUN_CREATED:
            run_input = payload["input"]
            out.conversation = payload.get("conversation")
            out.position = payload.get("position")
            out.context = payload.get("context") or ""
        elif kind == EventType.RUN_ROLLED_BACK:
            out.rolled_back = True
        elif kind == EventType.MODEL_RESPONSE:
            if not payload.get("discarded"):
                contents[payload["turn_index"]] = payload["content"]
                stops[payload["turn_index"]] = payload.get("stop_reason") or ""
            for name in USAGE_KEYS:
                out.usage[name] += int(payload["usage"].get(name, 0))
        elif kind == EventType.TOOL_CALL_REQUESTED:
            positions[key] = payload["position"]
        if "result" in payload and "tool_call_state" in payload:
            # tool_call_finished/resolved, approval_decided (rejected), tool_result_replaced.
            # Events written before result formats existed have none: they render as JSON.
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": payload["tool_call_id"],
                "content": render_result(payload["result"], payload.get("result_format")),
            }
            if payload.get("is_error"):
                block["is_error"] = True
            results[key] = block
        if kind == EventType.RUN_COMPLETED:
            out.stop_reason = payload["stop_reason"]
        elif kind in (EventType.RUN_CANCELLED, EventType.RUN_TIMED_OUT):
            out.stop_reason = kind.removeprefix("run_")
        elif kind == EventType.RUN_FAILED:
            out.error_code = payload["error_code"]
        elif kind == EventType.RUN_RESUMED:
            out.stop_reason, out.error_code = "", ""
    records = []
    for index, content in contents.items():
        keys = sorted((k for k in positions if k[0] == index), key=positions.get)
        results_of = [results[k] for k in keys if k in results]
        records.append(TurnRecord(index, content, results_of, stops.get(index, "")))
    out.messages = build_messages(run_input, records, context=out.context)
    out.segment = Segment(run_input, out.context, records)
    return out


def project_conversation(runs: Iterable[Iterable[Any]]) -> list[dict[str, Any]]:
    """The history of a conversation as the last of `runs` sends it, from the events of
    those runs (one event list per run, in any order): the runs in their order, rolled-back
    ones left out, each contributing its input, context and turns."""
    projections = sorted((project(events) for events in runs), key=lambda p: p.position or 0)
    segments = [p.segment for p in projections if p.segment is not None and not p.rolled_back]
    if not segments:
        return []
    *earlier, last = segments
    return build_messages(last.input, last.turns, context=last.context, earlier=earlier)


def _triples(events: Iterable[Any]) -> Iterable[tuple[int, str, dict[str, Any]]]:
    for event in events:
        if isinstance(event, tuple):
            yield event
        else:
            yield event.seq, event.type, event.payload
