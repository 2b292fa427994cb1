"""The Messages API's MCP connector as the stand-in plays it (standard library only).

Before sampling, the API asks a toolset's MCP server for its tools, unless the toolset pins
a listing (its `tools`) or an earlier assistant message carries that server's
`mcp_tool_listing` block. A listing it fetched comes back as an `mcp_tool_listing` block in
the answer: "Send the assistant message back unchanged, this block included, so later
requests use this listing instead of asking the MCP server again" (the anthropic SDK's
`BetaMCPToolListingBlock` and `BetaMCPToolsetParam.tools`, SDK 2.17; the MCP connector page,
https://platform.claude.com/docs/en/agents-and-tools/mcp-connector, does not describe the
block: the SDK's types, generated from the API's own definition, are the source). Where the
block goes in the answer is UNSOURCED: here, first.

The stand-in's servers list what `MessagesAPIServer.mcp_listings` says (server name -> the
tools, each {"name", "description", "input_schema"}); a server it has no listing for is not
checked. The model calls only a listed tool its toolset enables (the tool's own `configs`
entry, else `default_config`, else enabled: the connector page's allowlist and denylist):
a scripted `mcp_tool_use` of any other is a script the real model could not answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .script import Reply


class UnofferedMCPTool(ValueError):
    """A script's answer calls an MCP connector tool the model is not offered."""


def answered(
    body: dict[str, Any], reply: Reply, listings: Mapping[str, list[dict[str, Any]]] | None
) -> Reply:
    """`reply` as the API answers `body`: the listings it fetched first, then the scripted
    blocks, whose MCP tool uses it checks (UnofferedMCPTool)."""
    toolsets = _toolsets(body)
    if not toolsets:
        return reply
    listed = _pinned(body, toolsets)
    fetched = []
    for server in toolsets:
        if server not in listed and listings and server in listings:
            tools = [dict(t) for t in listings[server]]
            fetched.append({"type": "mcp_tool_listing", "mcp_server_name": server, "tools": tools})
            listed[server] = [str(t.get("name")) for t in tools]
    for block in reply.blocks():
        if block.get("type") == "mcp_tool_use":
            _check_use(block, toolsets, listed)
    return replace(reply, content=[*fetched, *reply.content]) if fetched else reply


def _toolsets(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        str(t.get("mcp_server_name")): t
        for t in body.get("tools") or ()
        if isinstance(t, dict) and t.get("type") == "mcp_toolset"
    }


def _pinned(body: dict[str, Any], toolsets: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Each server's tool names the request pins: its toolset's `tools`, else the last
    `mcp_tool_listing` block of that server in the messages."""
    listed: dict[str, list[str]] = {}
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "mcp_tool_listing":
                tools = block.get("tools") or ()
                listed[str(block.get("mcp_server_name"))] = [str(t.get("name")) for t in tools]
    for server, toolset in toolsets.items():
        if isinstance(toolset.get("tools"), list):
            listed[server] = [str(t.get("name")) for t in toolset["tools"]]
    return listed


def _check_use(
    block: dict[str, Any], toolsets: dict[str, dict[str, Any]], listed: dict[str, list[str]]
) -> None:
    server, name = str(block.get("server_name")), block.get("name")
    toolset = toolsets.get(server) or {}
    default = (toolset.get("default_config") or {}).get("enabled", True)
    own = (toolset.get("configs") or {}).get(name) or {}
    if not own.get("enabled", default):
        raise UnofferedMCPTool(
            f"the script calls MCP tool {name!r} on {server!r}, which the request's "
            "mcp_toolset disables"
        )
    if server in listed and name not in listed[server]:
        raise UnofferedMCPTool(
            f"the script calls MCP tool {name!r} on {server!r}, which is not in the listing "
            f"the request uses ({', '.join(listed[server]) or 'none'})"
        )
