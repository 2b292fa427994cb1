"""Scripted replies of the Messages API stand-in: what it answers, by step or by callable."""

from __future__ import annotations

import importlib
import json
import secrets
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# The real API's error type for each status code.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    """An id shaped like the API's (`toolu_01...`, `msg_01...`, `req_011C...`)."""
    return prefix + "01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))


def text(s: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": s}


def tool_use(
    name: str, input: dict[str, Any] | None = None, id: str | None = None
) -> dict[str, Any]:
    """A tool_use content block; the id is generated (once, by Reply) if not given."""
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": dict(input or {})}
    if id is not None:
        block["id"] = id
    return block


def server_tool_use(
    name: str, input: dict[str, Any] | None = None, id: str | None = None
) -> dict[str, Any]:
    """A server_tool_use block (a tool the API runs itself); the id is generated (once, by
    Reply) if not given, and given to the result block after it that has none."""
    block: dict[str, Any] = {"type": "server_tool_use", "name": name, "input": dict(input or {})}
    if id is not None:
        block["id"] = id
    return block


def mcp_tool(
    server: str, name: str, input: dict[str, Any], result: str, *, is_error: bool = False
) -> list[dict[str, Any]]:
    """A call of the Messages API's MCP connector as the API returns it: its `mcp_tool_use`
    and `mcp_tool_result` blocks (the API ran it on `server`)."""
    use = {"type": "mcp_tool_use", "name": name, "server_name": server, "input": dict(input)}
    answer = {
        "type": "mcp_tool_result",
        "is_error": is_error,
        "content": [{"type": "text", "text": result}],
    }
    return [use, answer]


def web_search(query: str, results: list[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """A web search as the API returns it: its server_tool_use and its result block, with
    `results` as (url, title) pairs."""
    return [
        server_tool_use("web_search", {"query": query}),
        {
            "type": "web_search_tool_result",
            "content": [
                {
                    "type": "web_search_result",
                    "url": url,
                    "title": title,
                    "encrypted_content": f"enc:{url}",
                    "page_age": None,
                }
                for url, title in results
            ],
        },
    ]


def code_execution(code: str, stdout: str = "", return_code: int = 0) -> list[dict[str, Any]]:
    """A code execution as the API returns it: its server_tool_use and its result block."""
    return [
        server_tool_use("code_execution", {"code": code}),
        {
            "type": "code_execution_tool_result",
            "content": {
                "type": "code_execution_result",
                "stdout": stdout,
                "stderr": "",
                "return_code": return_code,
                "content": [],
            },
        },
    ]


_SERVER_RESULTS = frozenset(
    {
        "mcp_tool_result",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
    }
)


@dataclass
class Reply:
    """One scripted answer of the fake API.

    `content` holds text / tool_use (or any other) blocks; a str is one text block.
    Missing tool_use ids are generated once, here, so a script that hands out the
    same Reply object twice answers with the same ids (like a deterministic model).
    A `status` >= 400 makes it an error reply in the API's error shape.
    """

    content: list[dict[str, Any]] | str = field(default_factory=list)
    # Default: "tool_use" if content has a tool_use block, "max_tokens" if truncated, else "end_turn".
    stop_reason: str | None = None
    stop_sequence: str | None = None
    # Any of input_tokens / output_tokens / cache_creation_input_tokens / cache_read_input_tokens
    # (and the nested server_tool_use / cache_creation); the rest are computed (input and
    # cache from the request and the stand-in's prompt cache, output: content size / 4,
    # server_tool_use from the server_tool_use blocks).
    usage: dict[str, int] | None = None
    # Seconds between Server-Sent Events (a slow stream).
    delay: float = 0.0
    # Seconds before the response headers (a slow first byte; also applies to JSON replies).
    latency: float = 0.0
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    # The error's `details` (e.g. {"error_code": "enforced_spend_limit_reached"}).
    error_details: dict[str, Any] | None = None
    # Extra response headers, e.g. {"retry-after": "2"}.
    headers: dict[str, str] = field(default_factory=dict)
    # Cut the last tool_use block's input JSON in half mid-stream (stop_reason "max_tokens").
    truncate_input: bool = False
    # Send an `event: error` of this type after the content blocks, instead of finishing the stream.
    stream_error: str | None = None
    # Close the connection abruptly after this many SSE events (a network failure mid-stream).
    drop_after: int | None = None
    # End the body cleanly after this many SSE events, before `message_stop` (a proxy or
    # gateway that closes the stream early: no error, just an incomplete message).
    end_after: int | None = None
    # Characters per text_delta (and per input_json_delta).
    chunk_size: int = 20
    # Hold the stream before its `hold_at`-th SSE event until this is set (a model still
    # writing for as long as a test needs: no race between a slow stream and what watches
    # it). A client that hangs up, or the stand-in stopping, ends the wait.
    hold: threading.Event | None = None
    hold_at: int = 12
    # The model that answered (default: the one requested): where the API fell back.
    model: str | None = None
    message_id: str | None = None
    # A structured output's answer (any JSON value): the content becomes its JSON text,
    # which must follow the request's output_config.format schema.
    output: Any = None
    # The response's stop_details; for stop_reason "refusal" the default is
    # {"type": "refusal", "category": None, "explanation": None}.
    stop_details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.output is not None:
            if self.content:
                raise ValueError("give a reply's content or its structured output, not both")
            self.content = [text(json.dumps(self.output))]
        if isinstance(self.content, str):
            self.content = [text(self.content)]
        blocks = []
        last_server_id = None
        for block in self.content:
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = new_id("toolu_")
            if block.get("type") == "server_tool_use":
                block.setdefault("id", new_id("srvtoolu_"))
                last_server_id = block["id"]
            if block.get("type") == "mcp_tool_use":
                block.setdefault("id", new_id("mcptoolu_"))
                last_server_id = block["id"]
            if block.get("type") in _SERVER_RESULTS and not block.get("tool_use_id"):
                block["tool_use_id"] = last_server_id
            blocks.append(block)
        self.content = blocks
        if self.truncate_input and not any(b.get("type") == "tool_use" for b in blocks):
            raise ValueError("truncate_input needs a tool_use block to truncate")
        if self.stop_reason is None:
            if self.truncate_input:
                self.stop_reason = "max_tokens"
            elif any(b.get("type") == "tool_use" for b in blocks):
                self.stop_reason = "tool_use"
            else:
                self.stop_reason = "end_turn"
        if self.stop_reason == "refusal":
            self.stop_details = {
                "type": "refusal",
                "category": None,
                "explanation": None,
                **(self.stop_details or {}),
            }
        if self.is_error:
            self.error_type = self.error_type or ERROR_TYPES.get(self.status, "api_error")
            self.error_message = self.error_message or f"fake {self.error_type} ({self.status})"

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    def blocks(self) -> list[dict[str, Any]]:
        """The content as the API returns it (a truncated tool_use input is cut off)."""
        blocks = [dict(b) for b in self.content]  # type: ignore[union-attr]
        if self.truncate_input:
            last = last_tool_use_index(blocks)
            # Nothing after the cut; a non-streamed truncated tool_use has no usable input.
            blocks = blocks[: last + 1]
            blocks[last]["input"] = {}
        return blocks


def error(
    status: int,
    error_type: str | None = None,
    message: str | None = None,
    *,
    retry_after: float | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An error reply, e.g. `error(429, retry_after=2)`, `error(529)`, `error(500)`."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["retry-after"] = f"{retry_after:g}"
    return Reply(status=status, error_type=error_type, error_message=message, headers=all_headers)


def spend_cap(*, should_retry: bool | None = None) -> Reply:
    """The 429 the API answers once the organization's tier spend cap is reached, as the
    rate-limits page shows it ("Reaching your spend cap",
    https://platform.claude.com/docs/en/api/rate-limits): `rate_limit_error`,
    `error.details.error_code` `enforced_spend_limit_reached`, no retry-after. Whether the
    API also sends `x-should-retry: false` with it is UNSOURCED: `should_retry` adds it."""
    headers = {} if should_retry is None else {"x-should-retry": str(should_retry).lower()}
    message = (
        "You have reached your API usage limits: your organization has crossed its monthly "
        "API usage threshold, set based on your organization's API tier. You will regain "
        "access on 2027-01-01 at 00:00 UTC."
    )
    details = {"error_code": "enforced_spend_limit_reached"}
    return Reply(status=429, error_message=message, error_details=details, headers=headers)


class ScriptExhausted(LookupError):
    """by_step() was asked for a step it has no reply for."""


Script = Callable[[dict[str, Any]], Any]
"""A script maps a request body to a Reply (or a str / block dict / list of blocks)."""


def step_of(body: dict[str, Any]) -> int:
    """The agent step a request is for: the number of assistant messages it carries."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def as_reply(value: Any, body: dict[str, Any]) -> Reply:
    """Coerce what a script returned into a Reply."""
    for _ in range(3):  # a script may return a callable (e.g. a by_step item)
        if not callable(value) or isinstance(value, Reply):
            break
        value = value(body)
    if isinstance(value, Reply):
        return value
    if isinstance(value, str | dict):
        return Reply([value] if isinstance(value, dict) else value)
    if isinstance(value, list):
        return Reply(value)
    raise TypeError(f"script returned {type(value).__name__}, expected a Reply")


def by_step(replies: list[Any]) -> Script:
    """A script answering `replies[i]` for step i (the number of assistant messages).

    A request re-sent for the same step (a retry, a crash recovery) gets the same
    answer. Items may be a Reply, a str, a block, a list of blocks, or a callable
    taking the request body. Asking past the end raises ScriptExhausted, which the
    server answers with a 400 naming the step.
    """
    items = list(replies)

    def script(body: dict[str, Any]) -> Reply:
        step = step_of(body)
        if step >= len(items):
            raise ScriptExhausted(
                f"fake API script exhausted: no reply for step {step} ({len(items)} scripted)"
            )
        return as_reply(items[step], body)

    return script


def last_tool_use_index(blocks: list[dict[str, Any]]) -> int:
    """The position of the last tool_use block in `blocks`."""
    return max(i for i, b in enumerate(blocks) if b.get("type") == "tool_use")


def script_from_steps(steps: Any, *, source: str = "script") -> Script:
    """A by_step script from JSON-shaped data: a list with one item per step.

    An item is a str (one text block), a block (a dict with "type"), a list of blocks,
    or a reply object: a dict of Reply fields (`content`, `stop_reason`, `usage`,
    `status`, `error_type`, `error_message`, `delay`, `headers`...). Each item becomes
    a Reply once, here, so a repeated request for a step gets the same tool_use ids.
    Raises ValueError naming the step for anything else.
    """
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{source}: expected a non-empty JSON list of steps")
    return by_step([_step_reply(item, f"{source}: step {n}") for n, item in enumerate(steps)])


# A hold is a threading.Event, which no JSON script can give.
_REPLY_FIELDS = frozenset(f.name for f in fields(Reply)) - {"hold", "hold_at"}


def _step_reply(item: Any, where: str) -> Reply:
    if isinstance(item, dict) and "type" not in item:
        unknown = sorted(set(item) - _REPLY_FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown reply field(s) {', '.join(unknown)} "
                f'(known: {", ".join(sorted(_REPLY_FIELDS))}; a content block needs a "type")'
            )
        _check_content(item.get("content", []), where)
        try:
            return Reply(**item)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
    if isinstance(item, dict):
        item = [item]
    _check_content(item, where)
    return Reply(item)


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in content
    ):
        raise ValueError(f'{where}: content must be a string or a list of blocks with a "type"')


def load_script(spec: str) -> Script:
    """The script named by `spec`: a JSON file (see script_from_steps) or `module:attribute`.

    The attribute may be a list of steps (as in the JSON file, or Reply objects) or a
    callable taking the request body (a Script, e.g. one made with by_step).
    """
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"{spec}: cannot read the script: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{spec}: not valid JSON: {exc}") from exc
        return script_from_steps(data, source=spec)
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec}: give a JSON file or module:attribute")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{spec}: cannot import it: {exc}") from exc
    if isinstance(value, list):
        return by_step(value)
    if callable(value):
        return value
    raise ValueError(f"{spec}: expected a list of steps or a callable, got {type(value).__name__}")
