"""A local fake of the Anthropic Messages API, for tests and benchmarks.

Standard library only, so bench scripts and Celery workers started by tests can
import it without the test dependencies. The server validates requests the way
the real API does (same error shapes and, where known, the same wording) and
answers with scripted replies, as JSON or as Server-Sent Events::

    from tests.messages_api import MessagesAPIServer, Reply, by_step, text, tool_use

    script = by_step([
        Reply([text("Let me look."), tool_use("search", {"q": "otters"})]),
        "Otters hold hands while sleeping.",  # a str is one text block
    ])
    with MessagesAPIServer(script) as api:
        client = AnthropicModelClient(base_url=api.base_url, api_key="test")
        ...
        assert api.steps() == {0: 1, 1: 1}
"""

from __future__ import annotations

import json
import re
import secrets
import select
import socket
import string
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ERROR_TYPES",
    "APIRequestError",
    "MessagesAPIServer",
    "Reply",
    "Script",
    "ScriptExhausted",
    "as_reply",
    "by_step",
    "error",
    "new_id",
    "step_of",
    "text",
    "tool_use",
    "validate_request",
]

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
_ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

# Top-level request keys the real API knows; anything else is "Extra inputs are not permitted".
_KNOWN_PARAMS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "metadata",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "thinking",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
        "output_config",
        "inference_geo",
        "speed",
        "cache_control",
        "diagnostics",
    }
)
_BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "mcp_tool_use",
        "mcp_tool_result",
        "tool_reference",
    }
)
_MAX_CACHE_BREAKPOINTS = 4


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
    # Any of input_tokens / output_tokens / cache_creation_input_tokens / cache_read_input_tokens;
    # the rest are estimated (input: request body size / 4, output: content size / 4, cache: 0).
    usage: dict[str, int] | None = None
    # Seconds between Server-Sent Events (a slow stream).
    delay: float = 0.0
    # Seconds before the response headers (a slow first byte; also applies to JSON replies).
    latency: float = 0.0
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    # Extra response headers, e.g. {"retry-after": "2"}.
    headers: dict[str, str] = field(default_factory=dict)
    # Cut the last tool_use block's input JSON in half mid-stream (stop_reason "max_tokens").
    truncate_input: bool = False
    # Send an `event: error` of this type after the content blocks, instead of finishing the stream.
    stream_error: str | None = None
    # Close the connection abruptly after this many SSE events (a network failure mid-stream).
    drop_after: int | None = None
    # Characters per text_delta (and per input_json_delta).
    chunk_size: int = 20
    model: str | None = None
    message_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.content, str):
            self.content = [text(self.content)]
        blocks = []
        for block in self.content:
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = new_id("toolu_")
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
            last = _last_tool_use_index(blocks)
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


class APIRequestError(Exception):
    """A request the API would refuse: `status`, `error_type` and `message` as it answers them."""

    def __init__(self, status: int, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ERROR_TYPES.get(status, "api_error")


def _invalid(message: str) -> APIRequestError:
    return APIRequestError(400, message)


def _last_tool_use_index(blocks: list[dict[str, Any]]) -> int:
    return max(i for i, b in enumerate(blocks) if b.get("type") == "tool_use")


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [text(content)] if content else []
    return content


def _check_cache_control(value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise _invalid(f"{where}.cache_control.type: Input should be 'ephemeral'")
    if value.get("ttl") not in (None, "5m", "1h"):
        raise _invalid(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    return 1


def _check_block(block: Any, where: str, role: str) -> int:
    """Validate one content block; returns its number of cache breakpoints."""
    if not isinstance(block, dict):
        raise _invalid(f"{where}: Input should be a valid dictionary or object")
    kind = block.get("type")
    if kind not in _BLOCK_TYPES:
        raise _invalid(
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the expected tags"
        )
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise _invalid(f"{where}.text: Field required")
        if not block["text"]:
            raise _invalid("messages: text content blocks must be non-empty")
    elif kind == "tool_use":
        if role != "assistant":
            raise _invalid(f"{where}: `tool_use` blocks can only be in `assistant` messages")
        tool_id = block.get("id")
        if not isinstance(tool_id, str) or not _ID_PATTERN.match(tool_id):
            raise _invalid(f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise _invalid(f"{where}.tool_use.name: Field required")
        if not isinstance(block.get("input"), dict):
            raise _invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if role != "user":
            raise _invalid(f"{where}: `tool_result` blocks can only be in `user` messages")
        if not isinstance(block.get("tool_use_id"), str):
            raise _invalid(f"{where}.tool_result.tool_use_id: Field required")
        if "is_error" in block and not isinstance(block["is_error"], bool):
            raise _invalid(f"{where}.tool_result.is_error: Input should be a valid boolean")
        inner = block.get("content")
        breakpoints = 0
        if isinstance(inner, list):
            for k, item in enumerate(inner):
                if not isinstance(item, dict) or item.get("type") not in {
                    "text",
                    "image",
                    "document",
                    "search_result",
                    "tool_reference",
                }:
                    raise _invalid(
                        f"{where}.tool_result.content.{k}: Input should be a valid block"
                    )
                breakpoints += _check_block(item, f"{where}.tool_result.content.{k}", "user")
        elif inner is not None and not isinstance(inner, str):
            raise _invalid(f"{where}.tool_result.content: Input should be a valid list or string")
        return breakpoints + _check_cache_control(block.get("cache_control"), where)
    return _check_cache_control(block.get("cache_control"), where)


def validate_request(body: Any) -> None:
    """Raise APIRequestError for a body the real Messages API would reject.

    Usable without the server, e.g. by an in-process fake model client.
    """
    if not isinstance(body, dict):
        raise _invalid("Input should be a valid dictionary")
    for key in body:
        if key not in _KNOWN_PARAMS:
            raise _invalid(f"{key}: Extra inputs are not permitted")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise _invalid(f"{key}: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise _invalid("model: Input should be a valid string")
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise _invalid("max_tokens: Input should be a valid integer")
    if max_tokens < 1:
        raise _invalid("max_tokens: Input should be greater than or equal to 1")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _invalid("stream: Input should be a valid boolean")
    for key, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _invalid(f"{key}: Input should be a valid number")
            if not low <= value <= high:
                raise _invalid(f"{key}: Input should be between {low:g} and {high:g}")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise _invalid("top_k: Input should be a non-negative integer")
    stop_sequences = body.get("stop_sequences")
    if stop_sequences is not None and (
        not isinstance(stop_sequences, list) or not all(isinstance(s, str) for s in stop_sequences)
    ):
        raise _invalid("stop_sequences: Input should be a valid list of strings")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _invalid("metadata: Input should be a valid dictionary")
        for key in metadata:
            if key != "user_id":
                raise _invalid(f"metadata.{key}: Extra inputs are not permitted")

    breakpoints = 0
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            raise _invalid("system: Input should be a valid string or list")
        for j, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise _invalid(f"system.{j}.type: Input should be 'text'")
            if not isinstance(block.get("text"), str) or not block["text"]:
                raise _invalid("system: text content blocks must be non-empty")
            breakpoints += _check_cache_control(block.get("cache_control"), f"system.{j}")

    tools = body.get("tools")
    tool_names: list[str] = []
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid("tools: Input should be a valid list")
        for j, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _invalid(f"tools.{j}: Input should be a valid dictionary")
            name = tool.get("name")
            if tool.get("type") in (None, "custom"):
                if not isinstance(name, str) or not _TOOL_NAME_PATTERN.match(name):
                    raise _invalid(
                        f"tools.{j}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
                    )
                schema = tool.get("input_schema")
                if not isinstance(schema, dict):
                    raise _invalid(f"tools.{j}.custom.input_schema: Field required")
                if schema.get("type", "object") != "object":
                    raise _invalid(f"tools.{j}.custom.input_schema.type: Input should be 'object'")
            elif not isinstance(name, str) or not name:
                raise _invalid(f"tools.{j}.name: Field required")
            tool_names.append(name)
            breakpoints += _check_cache_control(tool.get("cache_control"), f"tools.{j}")
        if len(set(tool_names)) != len(tool_names):
            raise _invalid("tools: Tool names must be unique.")

    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        if not isinstance(tool_choice, dict) or tool_choice.get("type") not in (
            "auto",
            "any",
            "tool",
            "none",
        ):
            raise _invalid(
                "tool_choice: Input tag found using 'type' does not match any of the expected "
                "tags: 'auto', 'any', 'tool', 'none'"
            )
        if tool_choice["type"] == "tool":
            name = tool_choice.get("name")
            if not isinstance(name, str):
                raise _invalid("tool_choice.tool.name: Field required")
            if name not in tool_names:
                raise _invalid(f"tool_choice.name: Tool '{name}' not found in tools")
        if "disable_parallel_tool_use" in tool_choice and not isinstance(
            tool_choice["disable_parallel_tool_use"], bool
        ):
            raise _invalid(
                f"tool_choice.{tool_choice['type']}.disable_parallel_tool_use: "
                "Input should be a valid boolean"
            )

    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid("messages: Input should be a valid list")
    if not messages:
        raise _invalid("messages: at least one message is required")
    parsed: list[tuple[str, list[dict[str, Any]]]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages.{i}: Input should be a valid dictionary")
        for key in message:
            if key not in ("role", "content"):
                raise _invalid(f"messages.{i}.{key}: Extra inputs are not permitted")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise _invalid(f"messages.{i}.content: Field required")
        content = message["content"]
        if not isinstance(content, str | list):
            raise _invalid(f"messages.{i}.content: Input should be a valid list")
        blocks = _content_blocks(content)
        for j, block in enumerate(blocks):
            breakpoints += _check_block(block, f"messages.{i}.content.{j}", role)
        is_final_assistant = i == len(messages) - 1 and role == "assistant"
        if not blocks and not is_final_assistant:
            raise _invalid(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        parsed.append((role, blocks))
    if parsed[0][0] != "user":
        raise _invalid('messages: first message must use the "user" role')
    if breakpoints > _MAX_CACHE_BREAKPOINTS:
        raise _invalid(
            f"A maximum of {_MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {breakpoints}."
        )

    has_tool_blocks = any(
        b.get("type") in ("tool_use", "tool_result") for _, blocks in parsed for b in blocks
    )
    if has_tool_blocks and not tools:
        raise _invalid(
            "Requests which include `tool_use` or `tool_result` blocks must define tools."
        )

    # First every tool_result must answer a tool_use of the assistant message just before it...
    for i, (role, blocks) in enumerate(parsed):
        if role != "user":
            continue
        expected: set[str] = set()
        if i > 0 and parsed[i - 1][0] == "assistant":
            expected = {b["id"] for b in parsed[i - 1][1] if b["type"] == "tool_use"}
        for j, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in expected:
                raise _invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block['tool_use_id']}. Each `tool_result` block "
                    "must have a corresponding `tool_use` block in the previous message."
                )
    # ...then every tool_use must be answered, first thing, by the next (user) message.
    seen_ids: set[str] = set()
    for i, (role, blocks) in enumerate(parsed):
        if role != "assistant":
            continue
        ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if not ids:
            continue
        if len(set(ids)) != len(ids) or seen_ids & set(ids):
            raise _invalid(f"messages.{i}: `tool_use` ids must be unique")
        seen_ids.update(ids)
        following = parsed[i + 1] if i + 1 < len(parsed) else None
        answered: set[str] = set()
        leading = 0
        if following is not None and following[0] == "user":
            answered = {b["tool_use_id"] for b in following[1] if b["type"] == "tool_result"}
            for block in following[1]:
                if block["type"] != "tool_result":
                    break
                leading += 1
        missing = [tool_id for tool_id in ids if tool_id not in answered]
        if missing:
            raise _invalid(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        if leading < len(ids):
            raise _invalid(
                f"messages.{i + 1}: Did not find {len(ids)} `tool_result` block(s) at the "
                "beginning of this message. Messages following `tool_use` blocks must begin "
                "with a matching number of `tool_result` blocks."
            )


def _chunks(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[k : k + size] for k in range(0, len(s), size)]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _ClientGone(Exception):
    """The client closed the connection."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: MessagesAPIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (aborted streams, closed pools) are normal here: stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _ClientGone) or self.api._stopping.is_set():
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like the real API
    server_version = "fake-anthropic"
    timeout = 60  # an idle keep-alive connection's thread ends after this
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: tests and benchmarks print their own story

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.api._track(self.connection, add=False)

    # -- plumbing ---------------------------------------------------------------------------

    def _send_json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", self._request_id)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, exc: APIRequestError, headers: dict[str, str] | None = None) -> None:
        self._rec["status"] = exc.status
        self._send_json(
            exc.status,
            {
                "type": "error",
                "error": {"type": exc.error_type, "message": exc.message},
                "request_id": self._request_id,
            },
            headers,
        )

    def _client_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True as soon as the client hangs up."""
        deadline = time.monotonic() + timeout
        api = self.server.api
        while True:
            remaining = deadline - time.monotonic()
            try:
                readable, _, _ = select.select(
                    [self.connection], [], [], max(0.0, min(remaining, 0.05))
                )
                if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
            if api._stopping.is_set():
                return True
            if remaining <= 0:
                return False
            if readable:
                # Unexpected bytes from the client (not a hang-up): just wait out the time.
                time.sleep(max(0.0, min(remaining, 0.05)))

    def _write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as exc:
            raise _ClientGone() from exc

    # -- requests ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._request_id = new_id("req_")
        self._rec = self.server.api._record(self, None)
        self._send_error(APIRequestError(404, f"Not found: {self.path}"))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        api = self.server.api
        self._request_id = new_id("req_")
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            self._rec = api._record(self, None)
            self._send_error(_invalid("There was an error parsing the body: invalid JSON"))
            return
        self._rec = api._record(self, body)
        path = self.path.split("?", 1)[0]
        if path != "/v1/messages":
            self._send_error(APIRequestError(404, f"Not found: {self.path}"))
            return
        try:
            self._check_headers()
            validate_request(body)
        except APIRequestError as exc:
            self._send_error(exc)
            return
        try:
            reply = as_reply(api.script, body) if api.script is not None else None
            if reply is None:
                raise ScriptExhausted("fake API has no script")
        except Exception as exc:  # noqa: BLE001 - a broken script is reported to the client
            api._script_error(exc)
            self._send_error(_invalid(f"{type(exc).__name__}: {exc}"))
            return
        stream = bool(body.get("stream"))
        if reply.latency and self._client_gone(reply.latency):
            if stream:
                api._disconnected()
            self.close_connection = True
            return
        if reply.is_error:
            self._send_error(
                APIRequestError(reply.status, reply.error_message or "", reply.error_type),
                reply.headers,
            )
        elif stream:
            self._stream(body, reply)
        else:
            self._rec["status"] = 200
            self._send_json(200, self._message(body, reply, reply.blocks()), reply.headers)

    def _check_headers(self) -> None:
        api = self.server.api
        key = self.headers.get("x-api-key")
        auth = self.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            key = key or auth[7:].strip()
        if not key:
            raise APIRequestError(401, "x-api-key header is required")
        if api.api_key is not None and key != api.api_key:
            raise APIRequestError(401, "invalid x-api-key")
        if not self.headers.get("anthropic-version"):
            raise _invalid("anthropic-version: header is required")

    def _usage(self, body: dict[str, Any], reply: Reply, content: list[dict[str, Any]]) -> dict:
        usage = {
            "input_tokens": max(1, len(json.dumps(body)) // 4),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": max(1, len(json.dumps(content)) // 4),
        }
        usage.update(reply.usage or {})
        return usage

    def _message(
        self, body: dict[str, Any], reply: Reply, content: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "id": reply.message_id or new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": reply.model or body["model"],
            "content": content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": reply.stop_sequence,
            "usage": {**self._usage(body, reply, content), "service_tier": "standard"},
        }

    def _events(self, body: dict[str, Any], reply: Reply) -> Iterator[bytes]:
        """The SSE events of a streamed reply, in the real API's order and shape."""
        content = [dict(b) for b in reply.content]  # type: ignore[union-attr]
        cut = _last_tool_use_index(content) if reply.truncate_input else None
        if cut is not None:
            content = content[: cut + 1]
        message = self._message(body, reply, [])
        message["stop_reason"] = message["stop_sequence"] = None  # only known at the end
        usage = self._usage(body, reply, content)
        message["usage"] = {**usage, "output_tokens": 1, "service_tier": "standard"}
        yield _sse("message_start", {"type": "message_start", "message": message})
        yield _sse("ping", {"type": "ping"})
        for index, block in enumerate(content):
            kind = block.get("type")
            if kind == "text":
                start: dict[str, Any] = {**block, "text": ""}
                deltas = [
                    {"type": "text_delta", "text": c}
                    for c in _chunks(block["text"], reply.chunk_size)
                ]
            elif kind in ("tool_use", "server_tool_use"):
                start = {**block, "input": {}}
                payload = json.dumps(block.get("input") or {})
                if index == cut:
                    payload = payload[: len(payload) // 2] if len(payload) > 2 else ""
                # The real API opens every tool input with an empty partial_json.
                deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                    {"type": "input_json_delta", "partial_json": c}
                    for c in _chunks(payload, reply.chunk_size)
                ]
            elif kind == "thinking":
                start = {**block, "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": c}
                    for c in _chunks(block.get("thinking", ""), reply.chunk_size)
                ] + [{"type": "signature_delta", "signature": block.get("signature", "")}]
            else:
                start, deltas = block, []
            yield _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            for delta in deltas:
                yield _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        if reply.stream_error:
            yield _sse(
                "error",
                {
                    "type": "error",
                    "error": {"type": reply.stream_error, "message": f"fake {reply.stream_error}"},
                    "request_id": self._request_id,
                },
            )
            return
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        api = self.server.api
        self._rec["status"] = 200
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", self._request_id)
        for key, value in reply.headers.items():
            self.send_header(key, value)
        try:
            self.end_headers()
            for n, event in enumerate(self._events(body, reply)):
                if reply.drop_after is not None and n >= reply.drop_after:
                    # Simulate a network failure: cut the connection without ending the body.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if n and reply.delay and self._client_gone(reply.delay):
                    raise _ClientGone()
                self._write_chunk(event)
            self._write_chunk(b"")  # the terminating zero-length chunk
        except (_ClientGone, OSError):
            self.close_connection = True
            if not api._stopping.is_set():
                api._disconnected()


class MessagesAPIServer:
    """A fake Messages API on 127.0.0.1 (a random port) in a daemon thread.

    Use as a context manager or call start()/stop(). `script(body) -> Reply` picks
    the answer to each valid request; change it any time via `.script = ...`.
    `api_key`, if given, is the only key accepted (any key is, by default).
    """

    def __init__(self, script: Script | None = None, *, api_key: str | None = None) -> None:
        self.script = script
        self.api_key = api_key
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._disconnects = 0
        self._script_errors: list[BaseException] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> MessagesAPIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.api = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
            name="fake-anthropic",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        # Wake handler threads parked on idle keep-alive connections or slow streams.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MessagesAPIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("MessagesAPIServer is not started")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """E.g. "http://127.0.0.1:PORT" (what ANTHROPIC_BASE_URL / base_url= take)."""
        return f"http://127.0.0.1:{self.port}"

    # -- observations ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Recorded requests (a copy): path, method, headers (lower-case), body, time, step, status, stream."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> dict[str, Any]:
        with self._lock:
            if not self._requests:
                raise LookupError("no request recorded")
            return self._requests[-1]

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the recorded requests."""
        return [r["body"] for r in self.requests]

    @property
    def disconnects(self) -> int:
        """Streamed responses whose client hung up before the stream finished."""
        with self._lock:
            return self._disconnects

    @property
    def script_errors(self) -> list[BaseException]:
        """Exceptions raised by the script (each was answered with a 400)."""
        with self._lock:
            return list(self._script_errors)

    def steps(self) -> Counter[int]:
        """Step index (assistant messages in the request) -> number of /v1/messages requests."""
        with self._lock:
            return Counter(
                r["step"] for r in self._requests if r["path"].startswith("/v1/messages")
            )

    def reset(self) -> None:
        """Forget recorded requests, disconnects and script errors (the script stays)."""
        with self._lock:
            self._requests.clear()
            self._disconnects = 0
            self._script_errors.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
        """Poll `predicate` until true or `timeout` seconds pass; returns its last value."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return predicate()
            time.sleep(0.01)
        return True

    # -- handler hooks --------------------------------------------------------------------------

    def _record(self, handler: _Handler, body: Any) -> dict[str, Any]:
        record = {
            "method": handler.command,
            "path": handler.path,
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "body": body,
            "time": time.time(),
            "step": step_of(body) if isinstance(body, dict) else 0,
            "stream": bool(body.get("stream")) if isinstance(body, dict) else False,
            "status": None,
            "request_id": handler._request_id,
        }
        with self._lock:
            self._requests.append(record)
        return record

    def _disconnected(self) -> None:
        with self._lock:
            self._disconnects += 1

    def _script_error(self, exc: BaseException) -> None:
        with self._lock:
            self._script_errors.append(exc)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
