"""Tools from Model Context Protocol servers (docs/how-to/mcp.md).

`Agent(mcp_servers=[MCPServer.stdio(...), MCPServer.http(...)])`: each server's tools are
listed when a run (or a conversation) starts and kept in its configuration snapshot; each
call is an `MCPTool`, a Tool of the engine like any other. The `mcp` package (the extra
`django-agentrun[mcp]`) is imported only when a server is talked to.
"""

from __future__ import annotations

from .servers import MCPServer, classify
from .snapshot import snapshot_tools, tool_of_record
from .tools import MCPTool, result_content

__all__ = ["MCPServer", "MCPTool", "classify", "result_content", "snapshot_tools", "tool_of_record"]
