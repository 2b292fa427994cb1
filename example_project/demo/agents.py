"""The demo's support agent: tell a customer about a delayed order, then log the ticket.

`issue_refund` needs a person's approval (the chat page, /chat/, shows its arguments and
asks); `send_customer_message` is the seed's dangerous tool: `non_idempotent` (a retry
would deliver a second message), with a `reconcile` check that asks the provider
whether it already accepted a message with this call's idempotency key, which is
sent as the provider's client reference. `order_status` comes from the order system's
MCP server (mcp_server.py, started over stdio; trusted, so its read-only annotation makes
the tool `read_only`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from django_agentrun import Agent, Budget, Reconciliation, SideEffect, ToolContext, tool
from django_agentrun.mcp import MCPServer

from .provider import Helpdesk, MessagingProvider, Payments

AGENT_NAME = "support-agent"

SYSTEM = """\
You are a customer support agent for an online shop. For the ticket you are given:
1. send the customer exactly one short, friendly message (send_customer_message) that
   explains the situation and the new delivery date;
2. then record what you did on the ticket (log_ticket), including the message id;
3. then answer with a one-sentence summary. Never send a second message."""

TICKET_ID = "T-1042"
CUSTOMER = "ada@example.com"
# The run's input: a ticket with what the order system knows already attached.
TICKET = f"""\
Ticket {TICKET_ID} from Ada Lovelace <{CUSTOMER}>:
"My order A-1001 was due on Monday and still hasn't arrived. Where is it?"

Order A-1001 (from the order system): 1 mechanical keyboard, shipped with ParcelCo,
tracking PC-88412, held at the carrier's hub; new delivery date: Friday."""


def message_already_sent(ctx: ToolContext, to: str, body: str) -> Reconciliation:
    """Ask the provider whether it accepted this call's message (by client reference)."""
    found = MessagingProvider().find(ctx.idempotency_key)
    if found is None:
        return Reconciliation.not_done()
    return Reconciliation.done({"message_id": found["message_id"]})


@tool(side_effect=SideEffect.NON_IDEMPOTENT, reconcile=message_already_sent)
def send_customer_message(ctx: ToolContext, to: str, body: str) -> dict:
    """Send a message to a customer's email address. Returns the provider's message id."""
    # The idempotency key travels as the client reference: it is what reconcile looks up.
    sent = MessagingProvider().send(to=to, body=body, client_reference=ctx.idempotency_key)
    return {"message_id": sent["message_id"]}


@tool(side_effect=SideEffect.IDEMPOTENT_WRITE)
def log_ticket(ctx: ToolContext, ticket_id: str, summary: str, message_id: str = "") -> dict:
    """Add a note to a helpdesk ticket saying what was done (and which message was sent)."""
    text = f"{summary} (message {message_id})" if message_id else summary
    note = Helpdesk().add_note(ticket_id=ticket_id, text=text, key=ctx.idempotency_key)
    return {"note_id": note["note_id"], "ticket_id": ticket_id}


@tool(side_effect=SideEffect.IDEMPOTENT_WRITE, requires_approval=True)
def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int, reason: str = "") -> dict:
    """Refund an order (money leaves the shop: a person approves it first)."""
    refund = Payments().refund(
        order_id=order_id, amount_cents=amount_cents, reason=reason, key=ctx.idempotency_key
    )
    return {"refund_id": refund["refund_id"], "order_id": order_id, "amount_cents": amount_cents}


# The order system, as an MCP server the worker starts (tools from MCP servers: the how-to).
ORDERS = MCPServer.stdio(
    "orders", sys.executable, args=[str(Path(__file__).with_name("mcp_server.py"))], trusted=True
)

support_agent = Agent(
    name=AGENT_NAME,
    model="claude-sonnet-5-5",
    system=SYSTEM,
    tools=[send_customer_message, log_ticket, issue_refund],
    mcp_servers=[ORDERS],
    max_turns=6,
    max_tokens=1024,
    budget=Budget(max_cost_usd=0.50),
)
