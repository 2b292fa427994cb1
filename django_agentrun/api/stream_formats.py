"""The formats of the live streams by name, and the media types that choose them."""

from __future__ import annotations

from .sse import EventsFormat
from .ui_messages import ConversationUIMessages, UIMessageFormat

FORMATS = {f.name: f for f in (EventsFormat, UIMessageFormat)}
# The formats of a conversation's stream, by the same names.
CONVERSATION_FORMATS = {"events": EventsFormat, "ai-sdk": ConversationUIMessages}
# Media types of Accept that choose a format (`?format=` wins).
ACCEPT = {
    "application/x-vercel-ai-ui-message-stream": "ai-sdk",
    "text/event-stream": "events",
}
