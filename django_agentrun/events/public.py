"""The event types a run's history holds, and what of their payloads may be shown.

The engine and the services write `RunEvent` payloads for the projection and for
people who debug a run in the admin: they hold the agent's configuration snapshot,
worker identities, lease epochs, approval tokens and idempotency keys. The API shows
a run's owner only what the run detail shows, so each type lists the payload keys
that are public (`ALLOWLIST`); everything else is dropped. A type without an entry
(a new event nobody listed yet) shows only `SAFE_KEYS`: it fails closed.

The admin shows whole payloads to staff, except approval tokens (`redact_secrets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from .types import EventType

# A spec maps a public key to None (its whole value) or to the spec of a nested object.
Spec = Mapping[str, Union["Spec", None]]

# Identities and states, shown by the run detail for every run, turn and tool call.
SAFE_KEYS: tuple[str, ...] = (
    "run_state",
    "turn_index",
    "turn_state",
    "tool_call_id",
    "tool_call_state",
)


def _keys(*names: str, **nested: Spec) -> Spec:
    return {**dict.fromkeys((*SAFE_KEYS, *names)), **nested}


# The call's result and who produced it (tool_call_finished, decisions that close a call).
_RESULT = ("result", "result_format", "is_error", "source")
_DECISION = ("decision", "by", "note")

# Left out on purpose: `config` (system prompt, tool schemas, budget), `worker`
# (host:pid), `epoch` and `attempts` of a recovery (lease internals), `token`,
# `idempotency_key`, `arguments_hash`, and the model's `message_id`/`request_id`.
# What stays is what the run detail shows; budget figures are in its error_message.
ALLOWLIST: dict[str, Spec] = {
    # A fork's run_created also names its original, the turn it forked at and who forked
    # it (services.fork_run); the run detail shows the first two. A conversation's run's
    # names its conversation, its place in it and its message's context.
    EventType.RUN_CREATED: _keys(
        "agent",
        "input",
        "correlation_id",
        "metadata",
        "owner",
        "deadline",
        "forked_from",
        "forked_at_turn",
        "forked_by",
        "conversation",
        "position",
        "context",
    ),
    EventType.RUN_ROLLED_BACK: _keys("by", "next_run"),
    EventType.RUN_STARTED: _keys(),
    EventType.CANCEL_REQUESTED: _keys("by", "reason"),
    EventType.RUN_CANCELLED: _keys("reason"),
    EventType.RUN_TIMED_OUT: _keys("reason"),
    EventType.RUN_RESUMED: _keys("by", "from"),
    EventType.RUN_FAILED: _keys("error_code", "error_message", "phase", "last_checkpoint"),
    EventType.RUN_COMPLETED: _keys("stop_reason", "output", "usage", "refusal", "parsed_output"),
    EventType.RUN_CONTINUED: _keys(),
    EventType.RUN_PARKED: _keys(),
    EventType.RECOVERY: _keys(),
    EventType.REAPER_REQUEUED: _keys("state"),
    EventType.TURN_STARTED: _keys("final"),
    EventType.TURN_COMPLETED: _keys(),
    EventType.TURN_CANCELLED: _keys(),
    EventType.TURN_FAILED: _keys(),
    EventType.MODEL_RESPONSE: _keys(
        "model", "stop_reason", "stop_details", "content", "usage", "thinking_tokens", "cost_usd"
    ),
    EventType.TOOL_CALL_REQUESTED: _keys("position", "name", "arguments", "side_effect"),
    EventType.TOOL_CALL_STARTED: _keys("attempt"),
    EventType.TOOL_CALL_FINISHED: _keys(*_RESULT),
    EventType.TOOL_CALL_RECOVERED: _keys("policy"),
    EventType.TOOL_CALL_UNKNOWN: _keys("reason"),
    EventType.TOOL_CALL_RESOLVED: _keys(*_RESULT, *_DECISION),
    EventType.APPROVAL_REQUESTED: _keys(
        "deadline",
        payload=dict.fromkeys(("tool", "description", "arguments", "side_effect", "run_id")),
    ),
    EventType.APPROVAL_DECIDED: _keys(*_RESULT, *_DECISION, "arguments"),
    EventType.LOOP_DETECTED: _keys("name", "count"),
    EventType.BUDGET_EXCEEDED: _keys("limit", "projected", "allowed"),
    EventType.TOOL_RESULT_REPLACED: _keys(*_RESULT, "by", "note"),
}
_UNLISTED: Spec = _keys()

# Keys whose values are secrets wherever they are nested (approval tokens).
SECRET_KEYS = frozenset({"token"})
REDACTED = "[redacted]"
# Encrypted reasoning (a redacted_thinking block's data) and a thinking block's signature:
# never shown, not even to staff.
_REASONING_SECRETS = frozenset({("data", "redacted_thinking"), ("signature", "thinking")})


def caller_context(context: Any, hook: Any) -> str:
    """A run's context as the API shows it: what the caller gave, without the text of the
    agent's context hook (the author's, like the system prompt: `hook`), which comes first."""
    if not isinstance(context, str):
        return ""
    if not isinstance(hook, str) or not hook:
        return context
    if context == hook:
        return ""
    return context.removeprefix(hook + "\n\n")


def public_payload(type: str, payload: Any) -> dict[str, Any]:
    """The part of an event's payload the API may show: its type's allowlisted keys (a
    run's context without its agent's hook's text)."""
    shown = _pick(ALLOWLIST.get(type, _UNLISTED), payload)
    if "context" in shown:
        shown["context"] = caller_context(shown["context"], payload.get("context_hook"))
    if isinstance(shown.get("content"), list):
        shown["content"] = shown_content(shown["content"])
    return shown


def shown_content(content: Any) -> Any:
    """Assistant content as people may see it: a thinking block's summarized text without
    its signature, a redacted_thinking block as its type alone (its data is encrypted
    reasoning, never shown). The stored content (sent back to the API) is unchanged."""
    if not isinstance(content, list):
        return content
    shown = []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "thinking":
            block = {"type": "thinking", "thinking": block.get("thinking", "")}
        elif kind == "redacted_thinking":
            block = {"type": "redacted_thinking"}
        shown.append(block)
    return shown


def thinking_text(content: Any) -> str:
    """The summarized thinking of assistant content (empty when omitted or redacted)."""
    return "\n\n".join(
        str(block.get("thinking") or "")
        for block in content or ()
        if isinstance(block, Mapping) and block.get("type") == "thinking" and block.get("thinking")
    )


def _pick(spec: Spec, payload: Any) -> dict[str, Any]:
    if not isinstance(payload, Mapping):
        return {}
    shown: dict[str, Any] = {}
    for key, nested in spec.items():
        if key in payload:
            shown[key] = payload[key] if nested is None else _pick(nested, payload[key])
    return shown


def redact_secrets(value: Any) -> Any:
    """A copy of `value` with every `SECRET_KEYS` value (and a redacted_thinking block's
    data, a thinking block's signature), however deeply nested, replaced by `REDACTED`. Iterative: a stored payload may nest deeper than Python's recursion limit."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        source, target, slot = stack.pop()
        if isinstance(source, Mapping):
            copy: dict[Any, Any] = {}
            kind = source.get("type")
            for key, item in source.items():
                if key in SECRET_KEYS or (key, kind) in _REASONING_SECRETS:
                    copy[key] = REDACTED
                else:
                    copy[key] = None  # keeps the key order; filled in below
                    stack.append((item, copy, key))
            target[slot] = copy
        elif isinstance(source, list):
            items: list[Any] = [None] * len(source)
            stack.extend((item, items, i) for i, item in enumerate(source))
            target[slot] = items
        else:
            target[slot] = source
    return root[0]
