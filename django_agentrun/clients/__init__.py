"""Model clients: the protocol the engine talks to, and the Anthropic implementation."""

from __future__ import annotations

from django.utils.module_loading import import_string

from .base import (
    ModelClient,
    ModelError,
    ModelRequest,
    ModelResponse,
    RateLimited,
    StreamAborted,
    Usage,
)

__all__ = [
    "ModelClient",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "RateLimited",
    "StreamAborted",
    "Usage",
    "get_model_client",
]

_cache: dict[str, ModelClient] = {}


def get_model_client() -> ModelClient:
    """Return the client selected by AGENTRUN_MODEL_CLIENT (a dotted path to a class or factory)."""
    from ..conf import agentrun_settings

    path = agentrun_settings.MODEL_CLIENT
    client = _cache.get(path)
    if client is None:
        client = import_string(path)()
        _cache[path] = client
    return client


def reset_model_client_cache() -> None:
    """Forget the cached clients, closing those that can be (their connection pools)."""
    clients = list(_cache.values())
    _cache.clear()
    for client in clients:
        close = getattr(client, "close", None)
        if callable(close):
            close()
