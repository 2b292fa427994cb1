"""The demo's offline model: a ScriptedClient that plays the support agent's three steps.

Selected with AGENTRUN_MODEL_CLIENT=example_project.demo.scripted.DemoScriptedClient.
Replies depend only on the step (how many assistant messages the request holds), so a
worker that takes over a run gets the same answer a dead one would have.
"""

from __future__ import annotations

import json

from django_agentrun.clients import ModelRequest
from django_agentrun.testing import Reply, ScriptedClient, text, tool_use

from .agents import CUSTOMER, TICKET_ID

SEND_ID = "toolu_demo_01_send_message"
LOG_ID = "toolu_demo_02_log_ticket"
STATUS_ID = "toolu_demo_02_order_status"

BODY = (
    "Hi Ada, sorry for the wait: your keyboard (order A-1001) is held at ParcelCo's hub "
    "and will now arrive on Friday. Tracking: PC-88412. - The Support Team"
)


def _recorded_message_id(request: ModelRequest) -> str:
    """The message id the runtime recorded for the send (executed or reconciled)."""
    for message in reversed(request.messages):
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        for block in message["content"]:
            if block.get("type") == "tool_result" and block.get("tool_use_id") == SEND_ID:
                if block.get("is_error"):
                    return ""
                try:
                    return str(json.loads(block["content"]).get("message_id", ""))
                except (TypeError, ValueError, AttributeError):
                    return ""
    return ""


def demo_reply(request: ModelRequest) -> Reply:
    """Step 0: send the message; step 1: check the order (MCP) and log the ticket with the
    message's id; step 2: summarize."""
    step = sum(1 for m in request.messages if m["role"] == "assistant")
    if step == 0:
        return Reply(
            [
                text("I'll tell Ada about the delay first."),
                tool_use("send_customer_message", {"to": CUSTOMER, "body": BODY}, id=SEND_ID),
            ]
        )
    message_id = _recorded_message_id(request)
    if step == 1:
        summary = "Told the customer the order is delayed at ParcelCo; new delivery date Friday."
        return Reply(
            [
                # The order system's MCP server (read-only), then the helpdesk.
                tool_use("order_status", {"order_id": "A-1001"}, id=STATUS_ID),
                tool_use(
                    "log_ticket",
                    {"ticket_id": TICKET_ID, "summary": summary, "message_id": message_id},
                    id=LOG_ID,
                ),
            ]
        )
    return Reply(
        [
            text(
                f"Done: Ada was told her order A-1001 arrives Friday (message {message_id}) "
                f"and ticket {TICKET_ID} is updated."
            )
        ]
    )


class DemoScriptedClient(ScriptedClient):
    """ScriptedClient with the demo's script; instantiated with no arguments by the engine."""

    def __init__(self) -> None:
        super().__init__(script=demo_reply)


# The chat page's offline model (`manage.py agentrun_chat --model scripted`): it streams
# its words slowly enough to watch, and asks for a refund (which needs an approval) when
# the message mentions one.
CHAT_DELAY = 0.04  # seconds between deltas of 8 characters
CHAT_ANSWER = (
    "Order A-1001 left our warehouse on Monday with ParcelCo (tracking PC-88412). It is "
    "held at the carrier's hub and the new delivery date is Friday. If you would rather "
    "not wait, ask me for a refund and I will start one once a person approves it."
)


def _last_said(request: ModelRequest) -> tuple[str, int]:
    """The newest user message with text in it, and the assistant messages after it."""
    for i in range(len(request.messages) - 1, -1, -1):
        message = request.messages[i]
        content = message["content"]
        if message["role"] != "user":
            continue
        texts = (
            [content]
            if isinstance(content, str)
            else [b.get("text", "") for b in content if b.get("type") == "text"]
        )
        if any(texts):
            after = request.messages[i + 1 :]
            return " ".join(texts), sum(1 for m in after if m["role"] == "assistant")
    return "", 0


def chat_reply(request: ModelRequest) -> Reply:
    said, step = _last_said(request)
    if "refund" not in said.lower():
        return Reply([text(CHAT_ANSWER)], chunk_delay=CHAT_DELAY)
    if step == 0:
        call = tool_use(
            "issue_refund",
            {"order_id": "A-1001", "amount_cents": 4999, "reason": "delayed delivery"},
            id=f"toolu_chat_{len(request.messages):04d}_refund",
        )
        return Reply(
            [text("I'll refund order A-1001 (49.99) once it is approved."), call],
            chunk_delay=CHAT_DELAY,
        )
    last = request.messages[-1]["content"]
    refused = isinstance(last, list) and any(b.get("is_error") for b in last)
    answer = (
        "The refund was not approved, so nothing was refunded."
        if refused
        else "The refund of 49.99 for order A-1001 is on its way: 3 to 5 working days."
    )
    return Reply([text(answer)], chunk_delay=CHAT_DELAY)


class DemoChatClient(ScriptedClient):
    """ScriptedClient with the chat page's script; instantiated with no arguments."""

    def __init__(self) -> None:
        super().__init__(script=chat_reply)
