"""A local fake of the Anthropic Messages API, for tests and benchmarks.

Standard library only, so bench scripts and Celery workers started by tests can
import it without the test dependencies. The server validates requests the way
the real API does (same error shapes and, where known, the same wording) and
answers with scripted replies, as JSON or as Server-Sent Events::

    from django_agentrun.testing.messages_api import MessagesAPIServer, Reply, by_step, text, tool_use

    script = by_step([
        Reply([text("Let me look."), tool_use("search", {"q": "otters"})]),
        "Otters hold hands while sleeping.",  # a str is one text block
    ])
    with MessagesAPIServer(script) as api:
        client = AnthropicModelClient(base_url=api.base_url, api_key="test")
        ...
        assert api.steps() == {0: 1, 1: 1}

`load_script("script.json")` reads a script from a JSON file (or `module:attribute`);
`python -m django_agentrun.testing.messages_api --script script.json` serves one.
"""

from __future__ import annotations

from .ratelimit import AccountLimit
from .script import (
    ERROR_TYPES,
    Reply,
    Script,
    ScriptExhausted,
    as_reply,
    by_step,
    code_execution,
    error,
    load_script,
    mcp_tool,
    new_id,
    script_from_steps,
    server_tool_use,
    spend_cap,
    step_of,
    text,
    tool_use,
    web_search,
)
from .server import MessagesAPIServer
from .servertools import compaction_block
from .validation import APIRequestError, validate_request

__all__ = [
    "ERROR_TYPES",
    "AccountLimit",
    "APIRequestError",
    "MessagesAPIServer",
    "Reply",
    "Script",
    "ScriptExhausted",
    "as_reply",
    "by_step",
    "code_execution",
    "compaction_block",
    "error",
    "load_script",
    "mcp_tool",
    "new_id",
    "script_from_steps",
    "server_tool_use",
    "spend_cap",
    "step_of",
    "text",
    "tool_use",
    "validate_request",
    "web_search",
]
