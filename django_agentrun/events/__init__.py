"""The run's history: every event type (types.py), each payload built in one place
(payloads.py), and what of a payload people may see (public.py)."""

from __future__ import annotations

from . import payloads
from .public import (
    ALLOWLIST,
    REDACTED,
    SAFE_KEYS,
    SECRET_KEYS,
    public_payload,
    redact_secrets,
    shown_content,
    thinking_text,
)
from .types import EventType

__all__ = [
    "ALLOWLIST",
    "REDACTED",
    "SAFE_KEYS",
    "SECRET_KEYS",
    "EventType",
    "payloads",
    "public_payload",
    "redact_secrets",
    "shown_content",
    "thinking_text",
]
