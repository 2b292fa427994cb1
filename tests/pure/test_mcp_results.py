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
