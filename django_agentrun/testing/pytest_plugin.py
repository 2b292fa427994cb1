"""pytest fixtures for testing agents offline, through the real `anthropic` SDK.

Registered through the `pytest11` entry point, so installing django-agentrun makes
them available to pytest (with pytest-django). Nothing here imports Django models
or reads settings until a fixture runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

ANTHROPIC_CLIENT = "django_agentrun.clients.anthropic.AnthropicModelClient"


@pytest.fixture
def agentrun_messages_api(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Messages API stand-in on a free local port, with the model client pointed at it.

    Set `.script` (e.g. `by_step([...])`) before the run asks; afterwards `.requests`,
    `.bodies`, `.steps()` and `.script_errors` tell what the agent sent. The real SDK
    talks to it (AGENTRUN_MODEL_CLIENT is the Anthropic client, ANTHROPIC_BASE_URL the
    stand-in, ANTHROPIC_API_KEY a dummy): no network, no key.
    """
    from django_agentrun.clients import get_model_client, reset_model_client_cache
    from django_agentrun.testing.messages_api import MessagesAPIServer

    with MessagesAPIServer() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        settings.AGENTRUN_MODEL_CLIENT = ANTHROPIC_CLIENT
        # Clients are cached per path, and the SDK reads the environment when it is made:
        # start from a fresh one, and close it (its connection pool) afterwards.
        reset_model_client_cache()
        client = get_model_client()
        try:
            yield server
        finally:
            client.close()
            reset_model_client_cache()
