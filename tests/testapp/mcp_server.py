"""A real MCP server for the tests, written with the `mcp` SDK (MCPServer, formerly FastMCP).

`python -m tests.testapp.mcp_server` serves it over stdio (a worker starts it);
`python -m tests.testapp.mcp_server --http PORT` over streamable HTTP (a test starts it).
Each tool appends a line (tool, idempotency key from the request's `_meta`, pid, and for
the HTTP server the `Authorization` header) to the file AGENTRUN_TEST_MCP_LOG names, so
tests count executions across killed workers and restarted servers. A cancelled call
appends a `cancelled` line. AGENTRUN_TEST_MCP_VERSION=2 changes its tool list (a new
description for `stock`, a new tool `discount`): a server that changed after a run began.

AGENTRUN_TEST_MCP_PROTOCOL picks the protocol its stdio transport speaks: unset, both (the
SDK serves the era the client opens with); `modern`, only 2026-07-28 (no `initialize`, no
`ping`: a client that opens with the handshake is refused, as a server that only speaks
the new protocol refuses it); `legacy`, only the earlier handshake (`server/discover` is
not a method it knows). AGENTRUN_TEST_MCP_ANNOTATIONS=0 leaves every tool unannotated.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations

from tests.mediafiles import png

server = MCPServer("shop")
VERSION = os.environ.get("AGENTRUN_TEST_MCP_VERSION", "1")
PROTOCOL = os.environ.get("AGENTRUN_TEST_MCP_PROTOCOL", "")
ANNOTATED = os.environ.get("AGENTRUN_TEST_MCP_ANNOTATIONS", "1") != "0"


def _one_era(protocol: str) -> None:
    """Serve one protocol era only (the SDK's stdio loop serves both; see the module)."""
    from mcp.server import runner

    if protocol == "modern":
        modern = runner._serve_modern_stream

        async def modern_only(server, read, write, *, lifespan_state, raise_exceptions, **_):
            await modern(
                server, read, write, lifespan_state=lifespan_state,
                raise_exceptions=raise_exceptions,
            )  # fmt: skip

        runner._serve_legacy_stream = modern_only
    elif protocol == "legacy":
        runner._has_modern_envelope = lambda params: False


_one_era(PROTOCOL)


def annotations(**hints) -> ToolAnnotations | None:
    return ToolAnnotations(**hints) if ANNOTATED else None


def record(tool: str, ctx: Context, **data) -> None:
    path = os.environ.get("AGENTRUN_TEST_MCP_LOG")
    if not path:
        return
    meta = ctx.request_context.meta or {}
    headers = ctx.headers or {}
    line = {
        "tool": tool,
        "key": dict(meta).get("io.github.django-agentrun/idempotency-key"),
        "pid": os.getpid(),
        "auth": headers.get("authorization"),
        "version": VERSION,
        **data,
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def calls(tool: str | None = None, path: str | None = None) -> list[dict]:
    """The lines the server appended (every server process), of `tool` or all."""
    path = path or os.environ.get("AGENTRUN_TEST_MCP_LOG")
    if not path or not Path(path).exists():
        return []
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if tool is None or r["tool"] == tool]


STOCK_DOC = "How many of an item are in stock." + (" (v2)" if VERSION == "2" else "")


@server.tool(description=STOCK_DOC, annotations=annotations(readOnlyHint=True))
async def stock(item: str, ctx: Context) -> dict:
    await ctx.report_progress(1, 2, "counting")
    record("stock", ctx, item=item)
    return {"item": item, "count": 3}


@server.tool(annotations=annotations(idempotentHint=True, destructiveHint=False))
async def set_flag(order: str, flag: str, ctx: Context) -> str:
    """Set a flag on an order (idempotent)."""
    await ctx.report_progress(1, 2, "flagging")
    record("set_flag", ctx, order=order, flag=flag)
    return f"{order} flagged {flag}"


@server.tool(annotations=annotations(destructiveHint=True))
async def refund(order: str, amount_cents: int, ctx: Context) -> str:
    """Refund an order (destructive: once only)."""
    await ctx.report_progress(1, 2, "refunding")
    record("refund", ctx, order=order, amount_cents=amount_cents)
    return f"refunded {amount_cents} on {order}"


@server.tool(annotations=annotations(readOnlyHint=True))
async def wait(seconds: float, ctx: Context) -> str:
    """Wait, reporting progress every 0.2 s (a long call to cancel)."""
    record("wait_started", ctx, seconds=seconds)
    try:
        steps = max(1, int(seconds / 0.2))
        for i in range(steps):
            await ctx.report_progress(i, steps, "waiting")
            await anyio.sleep(0.2)
    except anyio.get_cancelled_exc_class():
        record("cancelled", ctx)
        raise
    record("wait", ctx, seconds=seconds)
    return "waited"


@server.tool(annotations=annotations(readOnlyHint=True), structured_output=False)
async def chart(ctx: Context) -> list:
    """A chart, as an image and its caption."""
    return [
        TextContent(type="text", text="the chart"),
        ImageContent(type="image", data=_png(), mime_type="image/png"),
    ]


@server.tool(annotations=annotations(readOnlyHint=True))
async def miscount(item: str, ctx: Context) -> CallToolResult:
    """Count an item (its answer breaks its own output schema: `count` is not a number)."""
    record("miscount", ctx, item=item)
    return CallToolResult(
        content=[TextContent(type="text", text='{"count": "many"}')],
        structured_content={"count": "many"},
    )


# The schema it advertises (set by hand, so the SDK's server does not check the answer
# against it): an answer that breaks it reaches the client, as a faulty server's.
server._tool_manager.get_tool("miscount").fn_metadata.output_schema = {
    "type": "object",
    "properties": {"count": {"type": "integer"}},
    "required": ["count"],
}


@server.tool(annotations=annotations(readOnlyHint=True))
async def broken(ctx: Context) -> str:
    """Always fails (an isError result)."""
    raise ToolError("the warehouse is closed")


if VERSION == "2":

    @server.tool(annotations=annotations(destructiveHint=True))
    async def discount(order: str, ctx: Context) -> str:
        """Discount an order (only in version 2)."""
        return "discounted"


def _png() -> str:
    import base64

    return base64.b64encode(png(2, 2)).decode("ascii")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        import uvicorn

        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run()


if __name__ == "__main__":
    main()
