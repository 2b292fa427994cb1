"""How an MCP server's CallToolResult (its wire form) becomes tool_result content, and what
a run keeps of a listed tool (no server needed: the wire forms are written out here)."""

from __future__ import annotations

import base64

import pytest

from django_agentrun.exceptions import ConfigurationError
from django_agentrun.mcp import MCPServer, result_content
from tests.mediafiles import png

PNG = base64.b64encode(png(2, 2)).decode()
PDF = base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()


def blocks(result):
    return list(result_content(result).blocks)


def test_result__text_image_and_embedded_resources():
    got = blocks(
        {
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "data": PNG, "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "body"}},
                {
                    "type": "resource",
                    "resource": {
                        "uri": "file:///a.pdf",
                        "mimeType": "application/pdf",
                        "blob": PDF,
                    },
                },
                {"type": "resource_link", "uri": "https://x.example/r", "name": "r"},
                {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
            ],
            "isError": False,
        }
    )
    assert [b["type"] for b in got] == ["text", "image", "document", "document", "text", "text"]
    assert got[1]["source"] == {"type": "base64", "media_type": "image/png", "data": PNG}
    assert got[2]["source"] == {"type": "text", "media_type": "text/plain", "data": "body"}
    assert got[2]["title"] == "file:///a.txt"
    assert got[3]["source"]["media_type"] == "application/pdf"
    assert got[4]["text"] == "Resource: r <https://x.example/r>"
    assert "audio" in got[5]["text"]


def test_result__structured_content_when_no_text_carries_it__empty_is_said():
    assert blocks({"content": [], "structuredContent": {"b": 1, "a": 2}}) == [
        {"type": "text", "text": '{"a":2,"b":1}'}
    ]
    with_text = {"content": [{"type": "text", "text": "x"}], "structuredContent": {"a": 1}}
    assert blocks(with_text) == [{"type": "text", "text": "x"}]
    assert blocks({"content": []}) == [{"type": "text", "text": "(no content)"}]


def test_result__an_image_the_api_would_refuse_is_described():
    got = blocks({"content": [{"type": "image", "data": PNG, "mimeType": "image/bmp"}]})
    assert got == [{"type": "text", "text": "[image (image/bmp) not shown]"}]


def test_record__filters_renames_overrides():
    server = MCPServer.stdio(
        "shop",
        "shop-mcp",
        trusted=True,
        exclude=["secret"],
        rename={"stock": "shop_stock"},
        tools={"shop_stock": {"side_effect": "non_idempotent", "requires_approval": True}},
    )
    listed = {
        "name": "stock",
        "description": "Stock.",
        "inputSchema": {"type": "object", "properties": {"item": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    }
    record = server.record(listed)
    assert record["definition"]["name"] == "shop_stock"
    assert record["remote"] == "stock"
    assert (record["side_effect"], record["requires_approval"]) == ("non_idempotent", True)
    assert server.record({"name": "secret", "inputSchema": {"type": "object"}}) is None
    with pytest.raises(ConfigurationError, match="rename"):
        server.record({"name": "bad name!", "inputSchema": {"type": "object"}})


def test_without_the_mcp_package__the_app_imports__a_server_says_how_to_install_it(
    monkeypatch,
):
    import sys

    from django_agentrun.mcp import connections

    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigurationError, match=r"django-agentrun\[mcp\]"):
        connections.list_tools(MCPServer.stdio("shop", "shop-mcp"), {})


def test_a_cancel_that_races_the_answer__the_answer_counts():
    """The answer arrives just as the cancel is seen: the call completed, and its result is
    what the handler returns (it was reported cancelled)."""
    import concurrent.futures

    from django_agentrun.abort import CANCEL_REQUESTED, AbortSignal
    from django_agentrun.mcp.connections import CallState, wait_for

    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    abort, state = AbortSignal(), CallState()
    state.sending()

    def answered_as_the_cancel_comes() -> None:
        if not future.done():
            future.set_result({"content": []})
            abort.abort(CANCEL_REQUESTED)

    assert wait_for(future, state, abort, answered_as_the_cancel_comes) is True
    assert future.result() == {"content": []}


def test_a_cancel__returns_once_the_cancellation_was_sent():
    """A cancelled call returns only after its coroutine unwound (where the SDK sends
    notifications/cancelled), not at once."""
    import asyncio
    import threading

    from django_agentrun.abort import CANCEL_REQUESTED, AbortSignal
    from django_agentrun.mcp.connections import CallState, wait_for

    loop = asyncio.new_event_loop()
    running = threading.Thread(target=loop.run_forever, daemon=True)
    running.start()
    state, abort, notified = CallState(), AbortSignal(), threading.Event()

    async def call() -> None:
        try:
            state.sending()
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # the SDK writing notifications/cancelled
            notified.set()
            raise
        finally:
            state.finished.set()

    future = asyncio.run_coroutine_threadsafe(call(), loop)
    threading.Timer(0.05, abort.abort, args=(CANCEL_REQUESTED,)).start()
    assert wait_for(future, state, abort, lambda: None) is False
    assert notified.is_set()
    loop.call_soon_threadsafe(loop.stop)
    running.join(5)
    loop.close()


def test_a_cancel_before_the_request_went__nothing_is_sent():
    import asyncio
    import concurrent.futures

    from django_agentrun.mcp.connections import CallState

    state = CallState()
    future: concurrent.futures.Future = concurrent.futures.Future()
    assert state.cancel(future) is True  # nothing was sent: no wait for a cancellation
    with pytest.raises(asyncio.CancelledError):
        state.sending()  # the coroutine, coming to send it, does not
    assert state.sent is False
