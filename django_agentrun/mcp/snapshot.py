"""What a run keeps of its agent's MCP servers' tools (`snapshot_tools`, at its start), and
the Tool of a call made from that record (`tool_of_record`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..exceptions import ConfigurationError
from . import connections
from .servers import MCPServer
from .tools import MCPTool


def snapshot_tools(
    agent: str, servers: Iterable[MCPServer], taken: Iterable[str], owner: Any = None
) -> dict[str, dict[str, Any]]:
    """Each server's tools as listed now, filtered and renamed: model name -> record
    (servers.MCPServer.record). `taken`: the agent's other tool names (a clash is refused)."""
    records: dict[str, dict[str, Any]] = {}
    taken = set(taken)
    for server in servers:
        for listed in connections.list_tools(server, server.headers_for(owner)):
            record = server.record(listed)
            if record is None:
                continue
            name = record["definition"]["name"]
            if name in taken or name in records:
                raise ConfigurationError(
                    f"Agent {agent}: MCP server {server.name}'s tool {name!r} clashes with "
                    "another tool of that name; rename it (rename={...}) or leave it out"
                )
            records[name] = record
    return records


def tool_of_record(
    servers: Mapping[str, MCPServer], record: Mapping[str, Any], run: Any = None
) -> MCPTool | None:
    """The Tool of a snapshot record (None: the agent no longer has that server)."""
    server = servers.get(record.get("server", ""))
    return MCPTool(server, record, run) if server is not None else None
