"""Test doubles shipped for users' tests and demos.

- `ScriptedClient` (here): a ModelClient answering from a script, in process.
- `django_agentrun.testing.messages_api`: a local HTTP server that speaks the Messages
  API (JSON and SSE) to the real `anthropic` SDK and rejects what the real API rejects.
"""

from __future__ import annotations

from .scripted import Reply, ScriptedClient, error, reply, sleep_reply, text, tool_use

__all__ = ["Reply", "ScriptedClient", "error", "reply", "sleep_reply", "text", "tool_use"]
