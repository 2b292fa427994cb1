"""The demo's order system as an MCP server (the `mcp` SDK's MCPServer, over stdio): the
support agent looks an order up with its read-only tool. The worker starts it as a child
process (`python mcp_server.py`), once per worker process."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("orders")

ORDERS = {
    "A-1001": {
        "order_id": "A-1001",
        "items": ["mechanical keyboard"],
        "carrier": "ParcelCo",
        "tracking": "PC-88412",
        "status": "held at the carrier's hub",
        "new_delivery_date": "Friday",
    }
}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def order_status(order_id: str) -> dict:
    """Look up an order in the order system: its items, carrier, tracking and status."""
    return ORDERS.get(order_id, {"order_id": order_id, "status": "unknown order"})


if __name__ == "__main__":
    server.run()
