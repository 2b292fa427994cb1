"""The API's serializers: `requests` (bodies, validated here and applied by `services`),
`responses` (read-only representations and the error body) and the `fields` they share.
Nothing here saves a model. Every name is importable from here, as it was when this
was one module."""

from __future__ import annotations

from .conversations import (
    ConversationCreateSerializer,
    ConversationDetailSerializer,
    ConversationRunSerializer,
    ConversationSerializer,
    MessageSerializer,
)
from .fields import ObjectField, RunInputField, StateField, StateFieldExtension, StorableCharField
from .requests import (
    IDEMPOTENCY_HEADER,
    TOKEN_HELP,
    ApproveSerializer,
    CancelSerializer,
    RejectSerializer,
    ResolveSerializer,
    RunCreateSerializer,
)
from .responses import (
    PENDING_STATES,
    CancelRequestSerializer,
    DecisionResultSerializer,
    ErrorSerializer,
    PendingDecisionSerializer,
    RunDetailSerializer,
    RunEventPageSerializer,
    RunEventSerializer,
    RunSerializer,
    ToolCallSerializer,
    TurnSerializer,
    UsageSerializer,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "PENDING_STATES",
    "TOKEN_HELP",
    "ApproveSerializer",
    "CancelRequestSerializer",
    "CancelSerializer",
    "ConversationCreateSerializer",
    "ConversationDetailSerializer",
    "ConversationRunSerializer",
    "ConversationSerializer",
    "DecisionResultSerializer",
    "ErrorSerializer",
    "MessageSerializer",
    "ObjectField",
    "PendingDecisionSerializer",
    "RejectSerializer",
    "ResolveSerializer",
    "RunCreateSerializer",
    "RunDetailSerializer",
    "RunEventPageSerializer",
    "RunEventSerializer",
    "RunInputField",
    "RunSerializer",
    "StateField",
    "StateFieldExtension",
    "StorableCharField",
    "ToolCallSerializer",
    "TurnSerializer",
    "UsageSerializer",
]
