"""An MCP server's tool as a `Tool` of the engine (`MCPTool`), made from a run's snapshot
record (servers.MCPServer.record) so that a replay, a resume and the prompt cache see the
tool as it was when the run began, however the server changes; and how an MCP result
becomes tool_result content (`result_content`).

Everything the engine does with a local tool applies: write-ahead, the recovery policy of
its class, approvals, the reaper. `invoke` sends `tools/call` with the call's idempotency
key in `_meta` (servers that can use it do), a cancel becomes MCP's cancellation, and
progress notifications heartbeat the call and go to the run's live stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from .. import failpoints, streams
from ..content import ToolResult
from ..exceptions import InvalidContent, ToolError
from ..failpoints import failpoint
from ..media import IMAGE_TYPES
from ..side_effects import meaning
from ..tools import Reconciliation, Tool, ToolArgumentsError, ToolContext, canonical_json
from . import connections
from .servers import MCPServer

# The key of the idempotency key in a tools/call request's `_meta`: a custom key takes a
# prefix, "implementations SHOULD use reverse DNS notation (e.g., com.example/)", and a
# prefix whose second label is modelcontextprotocol or mcp is MCP's own (MCP, Basic,
# "_meta": https://modelcontextprotocol.io/specification/2025-11-25/basic#meta).
META_KEY = "io.github.django-agentrun/idempotency-key"


class MCPTool(Tool):
    """A tool of an MCP server, as a run's snapshot recorded it (see the module)."""

    def __init__(self, server: MCPServer, record: Mapping[str, Any], run: Any = None) -> None:
        definition = record["definition"]
        override = server.tools.get(definition["name"], {})
        approval = override.get("requires_approval")
        timeout = override.get("approval_timeout")
        super().__init__(
            name=definition["name"],
            description=definition.get("description") or "",
            side_effect=record["side_effect"],
            reconcile=override.get("reconcile"),
            requires_approval=approval if callable(approval) else record["requires_approval"],
            approval_timeout=timeout if isinstance(timeout, timedelta) else None,
        )
        self.server = server
        self.record = record
        self.remote = record["remote"]
        self.run = run  # whose owner's headers an HTTP server gets
        # The input schema is the server's (JSON Schema), not a Python signature's.
        self._schema = definition.get("input_schema") or {"type": "object"}

    def __repr__(self) -> str:
        return f"<MCPTool {self.name} ({self.server.name}:{self.remote}, {self.side_effect})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self!r} runs through the engine, not as a function")

    def input_schema(self) -> dict[str, Any]:
        return dict(self._schema)

    def definition(self) -> dict[str, Any]:
        return dict(self.record["definition"])

    def validate(self, arguments: Any) -> dict[str, Any]:
        """The arguments checked against the server's input schema (JSON Schema)."""
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                f"Tool {self.name} expects a JSON object of arguments, got {type(arguments).__name__}."
            )
        try:
            import jsonschema  # noqa: PLC0415 - installed with mcp
        except ImportError:  # pragma: no cover - the server checks them then
            return dict(arguments)
        validator = jsonschema.validators.validator_for(self._schema)(self._schema)
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            text = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
                for e in problems[:5]
            )
            raise ToolArgumentsError(f"Invalid arguments for tool {self.name}: {text}")
        return dict(arguments)

    def headers(self) -> dict[str, str]:
        owner = getattr(self.run, "owner", None) if self.run is not None else None
        return self.server.headers_for(owner) if self.server.transport == "http" else {}

    def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        progress = _progress(ctx, self.run)
        result = connections.call_tool(
            self.server,
            self.headers(),
            self.remote,
            arguments,
            meta={META_KEY: ctx.idempotency_key, "progressToken": ctx.idempotency_key},
            abort=ctx.abort,
            on_progress=progress,
            # Safe to make again: a timeout is the model's to handle, not a person's.
            timeout_is_an_answer=meaning(self.side_effect).timeout_is_an_answer,
        )
        content = result_content(result)
        if result.get("isError"):
            raise ToolError(_text_of(content) or f"Tool {self.name} failed.", content=content)
        return content

    def invoke_reconcile(self, ctx: ToolContext, arguments: dict[str, Any]) -> Reconciliation:
        assert self.reconcile is not None
        return self._checked(self.reconcile(ctx, **arguments), self.name)


def _progress(ctx: ToolContext, run: Any) -> Callable[[float, float | None, str | None], None]:
    """Each progress notification: a heartbeat of the call, and an ephemeral entry on the
    run's live stream (not a RunEvent: a tick is not part of the run's record)."""

    def on_progress(value: float, total: float | None, message: str | None) -> None:
        ctx.heartbeat()
        item = {"tool_call_id": ctx.tool_call_id, "tool": ctx.tool_name, "progress": value}
        item.update(total=total, message=message)
        streams.progress(run if run is not None else ctx.run_id, item)
        if failpoints.armed():
            failpoint("mcp.progress", ctx.tool_name)

    return on_progress


def result_content(result: Mapping[str, Any]) -> ToolResult:
    """MCP's CallToolResult (wire form) as tool_result content: text as text, images as
    image blocks, embedded resources as documents (text, PDF) or images, links and audio
    as a line of text; `structuredContent` as its JSON text when no text block carries it."""
    blocks: list[dict[str, Any]] = []
    for item in result.get("content") or ():
        blocks.extend(_blocks(item))
    structured = result.get("structuredContent")
    if structured is not None and not any(b.get("type") == "text" for b in blocks):
        blocks.append({"type": "text", "text": canonical_json(structured)})
    if not blocks:
        blocks = [{"type": "text", "text": "(no content)"}]
    try:
        return ToolResult(*blocks)
    except InvalidContent:
        # A block the API would refuse (an image that is not one): the model gets the text
        # of what was returned instead of a result that cannot be sent.
        return ToolResult(json.dumps(result.get("content"), ensure_ascii=False)[:100_000])


def _blocks(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type")
    if kind == "text":
        return [{"type": "text", "text": str(item.get("text", ""))}]
    if kind == "image":
        return [_image(item.get("mimeType"), item.get("data"), "image")]
    if kind == "audio":
        return [{"type": "text", "text": f"[audio ({item.get('mimeType')}) not shown]"}]
    if kind == "resource_link":
        name = item.get("title") or item.get("name") or ""
        return [{"type": "text", "text": f"Resource: {name} <{item.get('uri')}>"}]
    if kind == "resource":
        resource = item.get("resource") or {}
        uri, mime = str(resource.get("uri", "")), resource.get("mimeType")
        if "text" in resource:
            source = {"type": "text", "media_type": "text/plain", "data": str(resource["text"])}
            return [_titled({"type": "document", "source": source}, uri)]
        blob = resource.get("blob")
        if mime == "application/pdf" and isinstance(blob, str):
            source = {"type": "base64", "media_type": "application/pdf", "data": blob}
            return [_titled({"type": "document", "source": source}, uri)]
        if mime in IMAGE_TYPES:
            return [_image(mime, blob, uri)]
        return [{"type": "text", "text": f"[resource {uri} ({mime}) not shown]"}]
    return [{"type": "text", "text": canonical_json(dict(item))}]


def _titled(block: dict[str, Any], title: str) -> dict[str, Any]:
    return {**block, "title": title[:500]} if title else block


def _image(mime: Any, data: Any, what: str) -> dict[str, Any]:
    if mime in IMAGE_TYPES and isinstance(data, str):
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
    return {"type": "text", "text": f"[{what} ({mime}) not shown]"}


def _text_of(result: ToolResult) -> str:
    return "\n".join(b["text"] for b in result.blocks if b.get("type") == "text")
