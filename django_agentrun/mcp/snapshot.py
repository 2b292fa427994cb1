"""What a run keeps of its agent's MCP servers' tools (`snapshot_tools`, at its start), and
the Tool of a call made from that record (`tool_of_record`); the names of the tools of the
Messages API's MCP connector's servers (`connector_tools`), which the API calls itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..exceptions import ConfigurationError
from ..servertools import MCPConnector
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


def connector_tools(connector: MCPConnector, owner: Any = None) -> list[str]:
    """The names of the tools `connector`'s server lists now (with `owner`'s token), at its
    `list_url` or its `url`: what a run of it is offered (servertools.MCPConnector.pinned)."""
    token = connector.token_for(owner)
    server = MCPServer.http(
        f"connector-{connector.name}",
        connector.list_url or connector.url,
        headers={"Authorization": f"Bearer {token}"} if token else None,
    )
    return [str(t.get("name")) for t in connections.list_tools(server, server.headers_for(owner))]
