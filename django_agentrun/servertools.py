"""Server tools (the API runs them itself) and context management, as an Agent declares them.

Names and versions come from the installed `anthropic` SDK's own request types
(`ToolUnionParam` for the tools, the beta `BetaContextManagementConfigParam` for context
management), so an Agent can name only what the SDK (and so the API) knows.

A server tool's blocks (`server_tool_use` and its `*_tool_result`) are part of the
assistant's content: recorded as returned and sent back unchanged, never a call this app
executes. `SERVER_RESULT_TYPES` says which result blocks answer which tool.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anthropic.types import ToolUnionParam

from .exceptions import ConfigurationError

# The families of server tools: the API executes them and returns their results itself.
_FAMILIES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")


def _literal(hints: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = hints.get(key)
    while typing.get_origin(value) in (typing.Required, typing.NotRequired, typing.Annotated):
        value = typing.get_args(value)[0]
    return tuple(a for a in typing.get_args(value) if isinstance(a, str))


def _server_tools() -> dict[str, tuple[str, frozenset[str]]]:
    """type -> (the name the API requires, the keys its param accepts), from the SDK."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for param in typing.get_args(ToolUnionParam):
        hints = typing.get_type_hints(param, include_extras=True)
        names = _literal(hints, "name")
        for kind in _literal(hints, "type"):
            if names and kind.startswith(_FAMILIES):
                found[kind] = (names[0], frozenset(hints))
    return found


SERVER_TOOLS: Mapping[str, tuple[str, frozenset[str]]] = _server_tools()
"""Each server tool type the installed SDK knows (e.g. "web_search_20250305"), with the
name the API requires for it and the options its param accepts."""

# What answers a server_tool_use of each tool name, in the same assistant message.
SERVER_RESULT_TYPES: Mapping[str, frozenset[str]] = {
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

# The Messages API's MCP connector (servers the API calls itself): its blocks. The
# `mcp_tool_listing` block an answer may carry (the tools the API listed) is no server
# tool's: kept and sent back with the rest of the content (MCPConnector).
MCP_CONNECTOR_BLOCK_TYPES = frozenset({"mcp_tool_use", "mcp_tool_result"})

# Content block types of server tools: recorded and sent back, never executed here.
SERVER_BLOCK_TYPES = (
    frozenset({"server_tool_use"})
    .union(*SERVER_RESULT_TYPES.values())
    .union(MCP_CONNECTOR_BLOCK_TYPES)
)


def server_tool_uses(content: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The server tools an answer used, each with its result block (None: not returned yet,
    a turn paused with `pause_turn`): {"id", "name", "input", "result_type", "result"}; the
    MCP connector's `mcp_tool_use` blocks among them, with their "server_name"."""
    uses: dict[str, dict[str, Any]] = {}
    for block in content or ():
        if block.get("type") in ("server_tool_use", "mcp_tool_use"):
            uses[str(block.get("id"))] = {
                "id": block.get("id"),
                "name": block.get("name"),
                "input": block.get("input"),
                "result_type": None,
                "result": None,
                # A use of the MCP connector names its server (mcp_tool_use.server_name:
                # https://platform.claude.com/docs/en/agents-and-tools/mcp-connector).
                **({"server_name": block.get("server_name")} if "server_name" in block else {}),
            }
        elif block.get("type") in SERVER_BLOCK_TYPES and block.get("tool_use_id") in uses:
            use = uses[block["tool_use_id"]]
            use.update(result_type=block["type"], result=block.get("content"))
    return list(uses.values())


def server_tool(type: str, **options: Any) -> dict[str, Any]:  # noqa: A002 - the API's key
    """A server tool's definition, e.g. `server_tool("web_search_20250305", max_uses=3)`.

    `type` is the versioned type exactly as the SDK spells it; the name is the one the
    API requires for it (given or not); options are the SDK param's own keys."""
    if type not in SERVER_TOOLS:
        known = ", ".join(sorted(SERVER_TOOLS))
        raise ConfigurationError(f"Unknown server tool type {type!r} (known: {known})")
    name, keys = SERVER_TOOLS[type]
    if options.get("name", name) != name:
        raise ConfigurationError(f"The server tool {type} must be named {name!r}")
    unknown = sorted(set(options) - keys)
    if unknown:
        raise ConfigurationError(
            f"The server tool {type} takes no option {', '.join(unknown)} "
            f"(it takes: {', '.join(sorted(keys - {'type', 'name'}))})"
        )
    return {"type": type, "name": name, **{k: v for k, v in options.items() if k != "name"}}


def is_server_tool(definition: Mapping[str, Any]) -> bool:
    return definition.get("type") in SERVER_TOOLS or definition.get("type") == "mcp_toolset"


@dataclass(frozen=True)
class MCPConnector:
    """An MCP server the Messages API calls itself (its MCP connector): a server tool.

    In `Agent(server_tools=[MCPConnector("docs", "https://...")])`. Each request carries the
    server in `mcp_servers` and an `mcp_toolset` in `tools`, with the beta header
    `mcp-client-2025-11-20` (https://platform.claude.com/docs/en/agents-and-tools/mcp-connector:
    "This feature requires the beta header"; the deprecated `mcp-client-2025-04-04` took the
    tool configuration inside `mcp_servers`). The answer's `mcp_tool_use` and
    `mcp_tool_result` blocks are recorded as returned and sent back unchanged: the API ran
    the call, this app never does. `authorization_token`: a string, or a function of the
    run's owner returning that owner's token; it is put in each request, never stored in the
    run's snapshot. `default_config` and `configs` are the toolset's own keys (enabled,
    defer_loading).

    Its tool list is kept with the run and its conversation by the API's own means: the
    answer to the first request carries the `mcp_tool_listing` block of what the API
    listed, kept and sent back with the turn like the connector's other blocks, and "later
    requests use this listing instead of asking the MCP server again" (the anthropic SDK's
    BetaMCPToolListingBlock; the MCP connector page does not describe the block)."""

    name: str
    url: str
    authorization_token: str | Any = None
    default_config: Mapping[str, Any] | None = None
    configs: Mapping[str, Mapping[str, Any]] | None = None

    beta = "mcp-client-2025-11-20"

    def __post_init__(self) -> None:
        if not self.name or not self.url.startswith("https://"):
            raise ConfigurationError(
                f"MCPConnector {self.name!r}: a name, and a URL starting with https:// "
                "(the API calls it)"
            )

    def toolset(self) -> dict[str, Any]:
        """Its entry in the request's `tools`."""
        entry: dict[str, Any] = {"type": "mcp_toolset", "mcp_server_name": self.name}
        if self.default_config:
            entry["default_config"] = dict(self.default_config)
        if self.configs:
            entry["configs"] = {k: dict(v) for k, v in self.configs.items()}
        return entry

    def server(self) -> dict[str, Any]:
        """Its entry in the request's `mcp_servers`, without the token (as a run keeps it)."""
        return {"type": "url", "url": self.url, "name": self.name}

    def token_for(self, owner: Any) -> str | None:
        token = self.authorization_token
        return token(owner) if callable(token) else token


def connector_servers(
    servers: list[Mapping[str, Any]], connectors: Mapping[str, MCPConnector], owner: Any
) -> list[dict[str, Any]]:
    """A request's `mcp_servers` (as a run keeps them) with each owner's token filled in."""
    out = []
    for server in servers:
        entry = dict(server)
        connector = connectors.get(str(entry.get("name")))
        token = connector.token_for(owner) if connector is not None else None
        if token:
            entry["authorization_token"] = token
        out.append(entry)
    return out


def is_tool_search(definition: Mapping[str, Any]) -> bool:
    return str(definition.get("type", "")).startswith("tool_search_tool_")


# -- context management (a beta of the Messages API in SDK 2.16) ---------------------------


@dataclass(frozen=True)
class Compaction:
    """Server-side compaction (`compact_20260112`): once the prompt passes `trigger_tokens`,
    the API summarizes the earlier conversation into a `compaction` block at the start of
    its answer. The block is kept in the turn's content and sent back unchanged; the API
    then reads the conversation from it on (what came before stays in this app's records,
    the admin and the API, but no longer reaches the model). With `pause_after`, the
    answer stops there (stop reason `compaction`) and the run goes on with the next turn."""

    trigger_tokens: int | None = None
    instructions: str | None = None
    pause_after: bool = False

    beta = "compact-2026-01-12"

    def edit(self) -> dict[str, Any]:
        edit: dict[str, Any] = {"type": "compact_20260112"}
        if self.trigger_tokens is not None:
            edit["trigger"] = {"type": "input_tokens", "value": self.trigger_tokens}
        if self.instructions:
            edit["instructions"] = self.instructions
        if self.pause_after:
            edit["pause_after_compaction"] = True
        return edit


@dataclass(frozen=True)
class ClearToolUses:
    """Context editing (`clear_tool_uses_20250919`): once the prompt passes
    `trigger_tokens`, the API replaces the results of the oldest tool uses (all but the
    last `keep`, never those of `exclude_tools`) with a placeholder before the model reads
    them. This app still sends and keeps every result: the edit is the API's, per request."""

    trigger_tokens: int | None = None
    keep: int | None = None
    clear_at_least: int | None = None
    exclude_tools: tuple[str, ...] = ()
    clear_tool_inputs: bool = False

    beta = "context-management-2025-06-27"

    def edit(self) -> dict[str, Any]:
        edit: dict[str, Any] = {"type": "clear_tool_uses_20250919"}
        if self.trigger_tokens is not None:
            edit["trigger"] = {"type": "input_tokens", "value": self.trigger_tokens}
        if self.keep is not None:
            edit["keep"] = {"type": "tool_uses", "value": self.keep}
        if self.clear_at_least is not None:
            edit["clear_at_least"] = {"type": "input_tokens", "value": self.clear_at_least}
        if self.exclude_tools:
            edit["exclude_tools"] = list(self.exclude_tools)
        if self.clear_tool_inputs:
            edit["clear_tool_inputs"] = True
        return edit


ContextStrategy = Compaction | ClearToolUses


def context_params(strategy: ContextStrategy | None) -> dict[str, Any] | None:
    """The request's `context_management` and the beta it needs, as a run keeps them."""
    if strategy is None:
        return None
    if not isinstance(strategy, Compaction | ClearToolUses):
        raise ConfigurationError(
            f"context_management must be Compaction(...) or ClearToolUses(...), not {strategy!r}"
        )
    for name in ("trigger_tokens", "keep", "clear_at_least"):
        value = getattr(strategy, name, None)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigurationError(f"{type(strategy).__name__}.{name} must be a positive int")
    return {"edits": [strategy.edit()], "beta": strategy.beta}


def check_server_tools(
    agent: str,
    definitions: Iterable[Mapping[str, Any]],
    own: Iterable[str],
    deferred: Iterable[str],
) -> None:
    """Refuse what the API would refuse on the first turn: an unknown type, two tools of a
    name, a deferred tool that is not the agent's own, deferring without a tool search."""
    definitions = list(definitions)
    own = set(own)
    names = [str(d.get("name")) for d in definitions]
    for definition in definitions:
        if not is_server_tool(definition):
            raise ConfigurationError(
                f"Agent {agent}: {definition!r} is not a server tool; use server_tool(type, ...)"
            )
        if definition.get("type") != "mcp_toolset":
            server_tool(**definition)
    names = [n for d, n in zip(definitions, names, strict=True) if d.get("type") != "mcp_toolset"]
    clash = (set(names) & own) | {n for n in names if names.count(n) > 1}
    if clash:
        raise ConfigurationError(f"Agent {agent}: duplicate tool names {sorted(clash)}")
    deferred = set(deferred)
    if deferred - own:
        raise ConfigurationError(
            f"Agent {agent}: defer_loading names tools it does not have: {sorted(deferred - own)}"
        )
    if deferred and not any(is_tool_search(d) for d in definitions):
        raise ConfigurationError(
            f"Agent {agent}: defer_loading needs a tool search server tool "
            '(server_tool("tool_search_tool_regex_20251119") or the bm25 one)'
        )
