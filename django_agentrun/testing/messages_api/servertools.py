"""Server tools and compaction as the real API checks them (standard library only).

The types and names are the installed SDK's (`anthropic.types.ToolUnionParam`; a test
keeps this copy equal to it). What the API checks: a server tool is declared with its
type's name, the requested model accepts it, a `defer_loading` tool needs a tool search
tool, and in the messages every `server_tool_use` is one of the request's server tools,
answered by its result block (of that tool's kind) in the same assistant message, except
at the end of the last message (a turn paused with `pause_turn`, continued now).
A `compaction` block comes back as the stand-in signed it, under a compaction request.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

# type -> the name the API requires (SDK 2.16's ToolUnionParam, the server-run families).
SERVER_TOOLS: dict[str, str] = {
    "web_search_20250305": "web_search",
    "web_search_20260209": "web_search",
    "web_search_20260318": "web_search",
    "web_fetch_20250910": "web_fetch",
    "web_fetch_20260209": "web_fetch",
    "web_fetch_20260309": "web_fetch",
    "web_fetch_20260318": "web_fetch",
    "code_execution_20250522": "code_execution",
    "code_execution_20250825": "code_execution",
    "code_execution_20260120": "code_execution",
    "code_execution_20260521": "code_execution",
    "tool_search_tool_bm25_20251119": "tool_search_tool_bm25",
    "tool_search_tool_bm25": "tool_search_tool_bm25",
    "tool_search_tool_regex_20251119": "tool_search_tool_regex",
    "tool_search_tool_regex": "tool_search_tool_regex",
}

# The result blocks that answer a server_tool_use of each name.
RESULT_TYPES: dict[str, frozenset[str]] = {
    "web_search": frozenset({"web_search_tool_result"}),
    "web_fetch": frozenset({"web_fetch_tool_result"}),
    "code_execution": frozenset(
        {
            "code_execution_tool_result",
            "bash_code_execution_tool_result",
            "text_editor_code_execution_tool_result",
        }
    ),
    "bash_code_execution": frozenset({"bash_code_execution_tool_result"}),
    "text_editor_code_execution": frozenset({"text_editor_code_execution_tool_result"}),
    "tool_search_tool_regex": frozenset({"tool_search_tool_result"}),
    "tool_search_tool_bm25": frozenset({"tool_search_tool_result"}),
}
RESULT_BLOCKS = frozenset().union(*RESULT_TYPES.values())
# Tools declared as code_execution also run these sub-tools (the API names them itself).
_ALSO_RUNS = {"code_execution": ("bash_code_execution", "text_editor_code_execution")}

# Context management edits (the beta `context_management.edits[].type`) and their betas.
EDIT_BETAS: dict[str, str] = {
    "clear_tool_uses_20250919": "context-management-2025-06-27",
    "clear_thinking_20251015": "context-management-2025-06-27",
    "compact_20260112": "compact-2026-01-12",
}
# The MCP connector's betas (https://platform.claude.com/docs/en/agents-and-tools/mcp-connector:
# "This feature requires the beta header" mcp-client-2025-11-20; a newer one, and the
# deprecated 2025-04-04, whose servers carried their own tool_configuration).
MCP_BETAS = frozenset({"mcp-client-2025-04-04", "mcp-client-2025-11-20", "mcp-client-2026-09-15"})
COMPACTION_DEFAULT_TRIGGER = 150_000
_KEY = b"django-agentrun Messages API stand-in: compaction signatures"


class Refusal(Exception):
    """A 400 the API answers (validation.py turns it into its APIRequestError)."""


def _accepted_by(model: str) -> frozenset[str] | None:
    """The server tool types the shipped model table says `model` accepts (None: unknown
    model, or no table). Read lazily: the table needs no Django settings."""
    try:
        from django_agentrun.catalog import shipped_info
    except ImportError:
        return None
    info = shipped_info(model)
    return None if info is None else frozenset(info.server_tools)


def check_tools(body: dict[str, Any]) -> dict[str, str]:
    """The request's server tools (name -> type), refusing what the API refuses."""
    declared: dict[str, str] = {}
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        return declared  # refused as such by the tools' own checks
    tools = [t for t in tools if isinstance(t, dict)]
    accepted = _accepted_by(str(body.get("model")))
    for j, tool in enumerate(tools):
        kind = tool.get("type")
        if not isinstance(kind, str) or kind == "custom":
            continue
        if kind.startswith(("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")):
            if kind not in SERVER_TOOLS:
                raise Refusal(
                    f"tools.{j}: Input tag '{kind}' found using 'type' does not match any of "
                    "the expected tags"
                )
            if tool.get("name") != SERVER_TOOLS[kind]:
                raise Refusal(f"tools.{j}.{kind}.name: Input should be '{SERVER_TOOLS[kind]}'")
            if accepted is not None and kind not in accepted:
                raise Refusal(f"tools.{j}: '{kind}' is not supported on model {body['model']}")
            declared[tool["name"]] = kind
    check_mcp_servers(body, tools)
    deferred = [t.get("name") for t in tools if t.get("defer_loading")]
    if deferred:
        if not any(str(t).startswith("tool_search_tool_") for t in declared.values()):
            raise Refusal(
                "tools: defer_loading requires a tool search tool (tool_search_tool_regex or "
                f"tool_search_tool_bm25) in tools; deferred: {', '.join(map(str, deferred))}"
            )
        if all(t.get("defer_loading") for t in tools):
            raise Refusal("tools: at least one tool must not have defer_loading set")
    return declared


def check_mcp_servers(body: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    """The MCP connector as the API checks it: each `mcp_servers` entry a url server with a
    unique name, referenced by exactly one `mcp_toolset` of `tools` (and no toolset naming
    a server the request does not define)."""
    servers = body.get("mcp_servers")
    toolsets = [t for t in tools if t.get("type") == "mcp_toolset"]
    if servers is None:
        if toolsets:
            raise Refusal("tools: an mcp_toolset needs its server in mcp_servers")
        return
    if not isinstance(servers, list):
        raise Refusal("mcp_servers: Input should be a valid list")
    names: list[str] = []
    for k, server in enumerate(servers):
        if not isinstance(server, dict) or server.get("type") != "url":
            raise Refusal(f"mcp_servers.{k}.type: Input should be 'url'")
        if not str(server.get("url", "")).startswith("https://"):
            raise Refusal(f"mcp_servers.{k}.url: must start with https://")
        if not isinstance(server.get("name"), str) or not server["name"]:
            raise Refusal(f"mcp_servers.{k}.name: Field required")
        names.append(server["name"])
    if len(set(names)) != len(names):
        raise Refusal("mcp_servers: MCP server names must be unique")
    named = [t.get("mcp_server_name") for t in toolsets]
    for name in names:
        if named.count(name) != 1:
            raise Refusal(
                f"mcp_servers: server '{name}' must be referenced by exactly one mcp_toolset"
            )
    for name in named:
        if name not in names:
            raise Refusal(f"tools: mcp_toolset names an unknown MCP server '{name}'")
    for k, toolset in enumerate(toolsets):
        if toolset.get("tools") is not None:  # a pinned listing (mcp_connector.py)
            _check_listed(toolset["tools"], f"tools.{k}.tools")


def _check_listed(tools: Any, where: str) -> None:
    """A pinned listing: each tool a name and an input schema (BetaMCPToolParamParam)."""
    if not isinstance(tools, list):
        raise Refusal(f"{where}: Input should be a valid list")
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise Refusal(f"{where}.{k}.name: Field required")
        if not isinstance(tool.get("input_schema"), dict):
            raise Refusal(f"{where}.{k}.input_schema: Input should be a valid dictionary")


def check_mcp_beta(body: dict[str, Any], betas: set[str] | None) -> None:
    if body.get("mcp_servers") is not None and betas is not None and not betas & MCP_BETAS:
        raise Refusal("mcp_servers: requires the anthropic-beta header 'mcp-client-2025-11-20'")


def check_messages(
    body: dict[str, Any], parsed: list[tuple[str, list[dict[str, Any]]]], declared: dict[str, str]
) -> None:
    """Server tool and compaction blocks in the messages, as the API checks them."""
    runs = set(declared)
    for name in list(runs):
        runs.update(_ALSO_RUNS.get(name, ()))
    compacting = any(
        isinstance(e, dict) and e.get("type") == "compact_20260112"
        for e in (body.get("context_management") or {}).get("edits") or ()
    )
    last = len(parsed) - 1
    open_uses: dict[str, str] = {}
    # Programmatic tool calling: a server tool use (code execution) that called a client
    # tool stays open across the client's tool_result; its result arrives in a later
    # response ("Claude writes code ... execution pauses at a tool call ... returns
    # tool_use ... you provide the result ... execution continues", Programmatic tool
    # calling, https://platform.claude.com/docs/en/agents-and-tools/tool-use/programmatic-tool-calling).
    awaiting: dict[str, str] = {}
    for i, (role, blocks) in enumerate(parsed):
        if i == 0 or parsed[i - 1][0] != role:
            open_uses = {}  # consecutive messages of a role are one (a paused turn, continued)
            awaited = set(awaiting) if role == "assistant" else set()
        for j, block in enumerate(blocks):
            kind = block["type"]
            where = f"messages.{i}.content.{j}"
            if kind in ("mcp_tool_use", "mcp_tool_result", "mcp_tool_listing"):
                _check_mcp_block(block, where, role, body, open_uses)
                continue
            if kind == "server_tool_use" or kind in RESULT_BLOCKS or kind == "compaction":
                if role != "assistant":
                    raise Refusal(f"{where}: `{kind}` blocks can only be in `assistant` messages")
            if kind == "server_tool_use":
                tool_id, name = block.get("id"), block.get("name")
                if not isinstance(tool_id, str) or not tool_id.startswith("srvtoolu_"):
                    raise Refusal(
                        f"{where}.server_tool_use.id: String should match pattern '^srvtoolu_[a-zA-Z0-9_]+$'"
                    )
                if not isinstance(block.get("input"), dict):
                    raise Refusal(
                        f"{where}.server_tool_use.input: Input should be a valid dictionary"
                    )
                if name not in runs:
                    raise Refusal(
                        f"{where}: `server_tool_use` block for '{name}', a server tool that is "
                        "not in the request's tools"
                    )
                open_uses[tool_id] = name
            elif kind in RESULT_BLOCKS:
                tool_id = block.get("tool_use_id")
                name = None
                if isinstance(tool_id, str):
                    name = open_uses.pop(tool_id, None) or awaiting.pop(tool_id, None)
                if name is None or kind not in RESULT_TYPES.get(name, ()):
                    raise Refusal(
                        f"{where}: `{kind}` block with tool_use_id {tool_id!r} does not answer a "
                        "`server_tool_use` block before it"
                    )
                if "content" not in block:
                    raise Refusal(f"{where}.{kind}.content: Field required")
            elif kind == "compaction":
                if not compacting:
                    raise Refusal(
                        f"{where}: `compaction` blocks need context_management with a "
                        "compact_20260112 edit"
                    )
                if block.get("signature") != compaction_signature(block.get("content")):
                    raise Refusal(f"{where}: Invalid `signature` in `compaction` block")
        continued = i < last and parsed[i + 1][0] == role
        if role == "assistant" and not continued:
            callers = _callers(blocks)
            for tool_id in [t for t in open_uses if t in callers]:
                awaiting[tool_id] = open_uses.pop(tool_id)  # it called a client tool
            # A use awaited before this answer is answered in it, or calls a tool again.
            for tool_id in [t for t in awaited if t in awaiting and t not in callers]:
                open_uses[tool_id] = awaiting.pop(tool_id)
        if open_uses and not continued and not (i == last and role == "assistant"):
            raise Refusal(
                f"messages.{i}: `server_tool_use` ids were found without their result blocks "
                f"in the same message: {', '.join(open_uses)}"
            )


def _callers(blocks: list[dict[str, Any]]) -> set[str]:
    """The server tool uses the client tool_use blocks of a message were called from."""
    found = set()
    for block in blocks:
        caller = block.get("caller") if block.get("type") == "tool_use" else None
        if isinstance(caller, dict) and isinstance(caller.get("tool_id"), str):
            found.add(caller["tool_id"])
    return found


def _check_mcp_block(
    block: dict[str, Any], where: str, role: str, body: dict[str, Any], open_uses: dict[str, str]
) -> None:
    """An MCP connector block: in an assistant message, a use of a request's MCP server,
    answered by its result in the same message."""
    kind = block["type"]
    if role != "assistant":
        raise Refusal(f"{where}: `{kind}` blocks can only be in `assistant` messages")
    servers = {s.get("name") for s in body.get("mcp_servers") or () if isinstance(s, dict)}
    if kind == "mcp_tool_listing":  # BetaMCPToolListingBlockParam (mcp_connector.py)
        if block.get("mcp_server_name") not in servers:
            raise Refusal(
                f"{where}: `mcp_tool_listing` block for server "
                f"{block.get('mcp_server_name')!r}, which is not in the request's mcp_servers"
            )
        _check_listed(block.get("tools"), f"{where}.tools")
        return
    if kind == "mcp_tool_use":
        tool_id = block.get("id")
        if not isinstance(tool_id, str) or not tool_id.startswith("mcptoolu_"):
            raise Refusal(f"{where}.mcp_tool_use.id: String should match '^mcptoolu_'")
        if block.get("server_name") not in servers:
            raise Refusal(
                f"{where}: `mcp_tool_use` block for server {block.get('server_name')!r}, "
                "which is not in the request's mcp_servers"
            )
        if not isinstance(block.get("input"), dict):
            raise Refusal(f"{where}.mcp_tool_use.input: Input should be a valid dictionary")
        open_uses[tool_id] = "mcp"
        return
    tool_id = block.get("tool_use_id")
    if open_uses.pop(tool_id, None) != "mcp":
        raise Refusal(
            f"{where}: `mcp_tool_result` block with tool_use_id {tool_id!r} does not answer an "
            "`mcp_tool_use` block before it in the same message"
        )
    if not isinstance(block.get("is_error", False), bool):
        raise Refusal(f"{where}.mcp_tool_result.is_error: Input should be a valid boolean")


def check_context_management(body: dict[str, Any], betas: set[str] | None) -> None:
    value = body.get("context_management")
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("edits", []), list):
        raise Refusal("context_management.edits: Input should be a valid list")
    for k, edit in enumerate(value.get("edits", [])):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in EDIT_BETAS:
            raise Refusal(
                f"context_management.edits.{k}: Input tag '{kind}' found using 'type' does not "
                f"match any of the expected tags: {', '.join(map(repr, EDIT_BETAS))}"
            )
        if betas is not None and EDIT_BETAS[kind] not in betas:
            raise Refusal(
                f"context_management.edits.{k}: '{kind}' requires the "
                f"anthropic-beta header '{EDIT_BETAS[kind]}'"
            )
        trigger = edit.get("trigger")
        if trigger is not None and (
            not isinstance(trigger, dict)
            or not isinstance(trigger.get("value"), int)
            or trigger.get("type") not in ("input_tokens", "tool_uses")
        ):
            raise Refusal(f"context_management.edits.{k}.trigger: Input should be a valid trigger")


def compaction_signature(content: Any) -> str:
    return hmac.new(_KEY, repr(content).encode(), hashlib.sha256).hexdigest()


def compaction_block(summary: str) -> dict[str, Any]:
    """A compaction block as the stand-in answers it (signed: it must come back unchanged)."""
    return {"type": "compaction", "content": summary, "signature": compaction_signature(summary)}


def compact_edit(body: dict[str, Any]) -> dict[str, Any] | None:
    for edit in (body.get("context_management") or {}).get("edits") or ():
        if isinstance(edit, dict) and edit.get("type") == "compact_20260112":
            return edit
    return None


def should_compact(body: dict[str, Any], tokens: Callable[[Any], int]) -> bool:
    """A compaction is due: the request asks for it and the conversation since its last
    compaction block (what the API reads) passes the trigger."""
    edit = compact_edit(body)
    if edit is None:
        return False
    trigger = (edit.get("trigger") or {}).get("value") or COMPACTION_DEFAULT_TRIGGER
    messages = body.get("messages") or []
    since = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "compaction" for b in content
        ):
            since = i
    read = [body.get("system"), body.get("tools"), messages[since:]]
    return tokens(read) >= trigger


def server_tool_usage(content: list[dict[str, Any]]) -> dict[str, int]:
    """The usage's `server_tool_use` counters for the server tools a reply used."""
    names = [b.get("name") for b in content if b.get("type") == "server_tool_use"]
    return {
        "web_search_requests": names.count("web_search"),
        "web_fetch_requests": names.count("web_fetch"),
    }
