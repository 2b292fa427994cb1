"""Where live streams go: the Redis server (AGENTRUN_STREAM_URL, else Celery's broker when
it is Redis) and the key of each run's stream."""

from __future__ import annotations

import functools
from typing import Any

from ..conf import agentrun_settings

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def redis_url() -> str | None:
    """The Redis URL the streams use, or None (no Redis: durable events only)."""
    configured = agentrun_settings.STREAM_URL
    if configured is not None:
        return _usable(str(configured)) if configured else None
    return _usable(_broker_url())


def _usable(url: str | None) -> str | None:
    return url if url and url.startswith(REDIS_SCHEMES) else None


@functools.cache
def _broker_url() -> str | None:
    """Celery's broker URL (read once a process: the broker does not change at run time)."""
    try:
        from celery import current_app

        url = current_app.conf.broker_url
    except Exception:  # noqa: BLE001 - no Celery app: no broker to share
        return None
    if isinstance(url, list | tuple):  # failover URLs: the first
        url = url[0] if url else None
    return str(url) if url else None


def run_key(run_id: Any) -> str:
    """The Redis stream of a run's deltas and commit nudges."""
    return f"{agentrun_settings.STREAM_PREFIX}:run:{run_id}"


def conversation_key(conversation_id: Any) -> str:
    """The Redis stream of a conversation: its runs' deltas and nudges, each with the run's
    position in the conversation."""
    return f"{agentrun_settings.STREAM_PREFIX}:conversation:{conversation_id}"


def keys_of(run: Any) -> list[tuple[str, dict[str, Any]]]:
    """Where `run` (a Run, or only its id) publishes, with what each entry adds there: its
    own stream (nothing), and its conversation's if it has one (the run's position and id;
    a run's own stream is position 0 to its readers)."""
    pk = getattr(run, "pk", run)
    keys: list[tuple[str, dict[str, Any]]] = [(run_key(pk), {})]
    conversation = getattr(run, "conversation_id", None)
    if conversation is not None:
        tags = {"position": getattr(run, "conversation_position", 0), "run": str(pk)}
        keys.append((conversation_key(conversation), tags))
    return keys


def attempt_key(key: str) -> str:
    """Where the entry id of a stream's newest attempt marker is kept (the start of the
    answer being written: a client that connects mid-turn reads from there)."""
    return f"{key}:attempt"
