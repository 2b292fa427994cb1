"""Runs, turns, tool calls and the append-only event log.

State fields are django-fsm-2 `FSMField(protected=True)`: transitions change
state in memory (one method per target state, generated from `states.py`), and
`transitions.py` persists them (through `store`) with a compare-and-set UPDATE in the same
transaction as the events that record them.
"""

from __future__ import annotations

from .base import UsageCounts, idempotency_key_for
from .calls import ToolCall, ToolCallQuerySet, Turn
from .conversations import Conversation, ConversationQuerySet, status_of
from .events import RunEvent, RunEventQuerySet, RunEventRow
from .runs import Run, RunQuerySet
from .webhooks import (
    DeliveryKind,
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookSubscription,
    new_secret,
)

__all__ = [
    "Conversation",
    "DeliveryKind",
    "DeliveryStatus",
    "ConversationQuerySet",
    "Run",
    "RunEvent",
    "RunEventQuerySet",
    "RunEventRow",
    "RunQuerySet",
    "ToolCall",
    "ToolCallQuerySet",
    "Turn",
    "UsageCounts",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookSubscription",
    "idempotency_key_for",
    "new_secret",
    "status_of",
]
