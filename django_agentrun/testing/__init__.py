"""Test doubles shipped for users' tests and demos.

- `ScriptedClient` (here): a ModelClient answering from a script, in process.
- `django_agentrun.testing.messages_api`: a local HTTP server that speaks the Messages
  API (JSON and SSE) to the real `anthropic` SDK and rejects what the real API rejects;
  also a command line (`python -m django_agentrun.testing.messages_api`).
- `drive(run)`: advance a run in the test's process until it rests.
- `django_agentrun.testing.pytest_plugin`: the `agentrun_messages_api` fixture
  (registered with pytest through an entry point).
"""

from __future__ import annotations

from .drive import drive
from .scripted import Reply, ScriptedClient, error, reply, sleep_reply, text, tool_use

__all__ = ["Reply", "ScriptedClient", "drive", "error", "reply", "sleep_reply", "text", "tool_use"]
