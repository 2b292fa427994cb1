"""System checks of a deployment (beneath checks.py): database connections behind a
connection pooler, Django's own pool against what a worker process takes from it, the
broker's visibility timeout against the longest task, and settings that no longer do
anything. Read from settings only: no connection is opened.

docs/how-to/deploy.md explains each finding.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from .conf import agentrun_settings

# Ports where a transaction pooler usually listens: PgBouncer's default, Supabase's
# transaction pooler (Supavisor). A host name saying "pgbouncer" or "pooler" (Neon's
# `-pooler` endpoints, Supabase's `pooler.supabase.com`) tells the same.
POOLER_PORTS = {"6432", "6543"}
POOLER_HOST_WORDS = ("pgbouncer", "pooler")


def pooler_reason(database: dict[str, Any]) -> str | None:
    """Why `database` (a DATABASES entry) looks like a connection pooler, or None."""
    if not str(database.get("ENGINE", "")).endswith("postgresql"):
        return None
    port = str(database.get("PORT") or "")
    if port in POOLER_PORTS:
        return f"port {port}"
    host = str(database.get("HOST") or "").lower()
    word = next((w for w in POOLER_HOST_WORDS if w in host), None)
    return f"host {host!r}" if word else None


# psycopg_pool's defaults, which Django's pool takes (`"pool": True`): min_size 4, and a
# max_size of None meaning min_size.
POOL_MIN_SIZE = 4


def pool_max_size(database: dict[str, Any]) -> int | None:
    """The most connections Django's pool (OPTIONS "pool", Django 5.1+) of `database` opens
    in one process, or None without a pool."""
    pool = (database.get("OPTIONS") or {}).get("pool")
    if not pool:
        return None
    options = pool if isinstance(pool, dict) else {}
    size = options.get("max_size")
    return int(size if size is not None else options.get("min_size", POOL_MIN_SIZE))


def worker_pool_connections() -> int | None:
    """The connections a worker pool process can take from Django's pool at once while it
    advances a run: the task's own (which also runs `reap` and webhook deliveries) and one
    per other thread of a batch of tool calls (AGENTRUN_TOOL_CONCURRENCY - 1), held while a
    handler that touched the ORM runs (`ctx.heartbeat()`, an MCP call's progress). The
    lease heartbeat's connection is its own, outside the pool. None when the setting is
    invalid (agentrun.E026 says so)."""
    concurrency = agentrun_settings.TOOL_CONCURRENCY
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        return None
    return concurrency


def database_messages(databases: dict[str, Any] | None = None) -> list[checks.CheckMessage]:
    """Findings about each entry of `databases` (settings.DATABASES by default)."""
    found: list[checks.CheckMessage] = []
    for alias, database in (settings.DATABASES if databases is None else databases).items():
        if alias == "default":
            found.extend(pool_messages(alias, database))
        reason = pooler_reason(database)
        if reason is None:
            continue
        options = database.get("OPTIONS") or {}
        if not database.get("DISABLE_SERVER_SIDE_CURSORS"):
            found.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] looks like a connection pooler ({reason}) but "
                    "DISABLE_SERVER_SIDE_CURSORS is not set.",
                    hint="Behind PgBouncer in transaction mode set "
                    f"DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True: a "
                    "server-side cursor (QuerySet.iterator()) does not survive its "
                    "transaction's server connection. Session mode needs nothing "
                    "(silence agentrun.W030 then).",
                    id="agentrun.W030",
                )
            )
        if options.get("server_side_binding") and options.get("prepare_threshold", 5) is not None:
            found.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] looks like a connection pooler ({reason}) and uses "
                    "server-side binding: psycopg prepares a statement on the server connection "
                    "once it was sent prepare_threshold (5) times.",
                    hint=f"Set DATABASES[{alias!r}]['OPTIONS']['prepare_threshold'] = None "
                    "behind PgBouncer in transaction mode (or PgBouncer 1.21+ with "
                    "max_prepared_statements), or drop server_side_binding.",
                    id="agentrun.W031",
                )
            )
    return found


def pool_messages(alias: str, database: dict[str, Any]) -> list[checks.CheckMessage]:
    """Django's pool of the engine's database against what a worker process takes from it."""
    size, needed = pool_max_size(database), worker_pool_connections()
    if size is None or needed is None or size >= needed:
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] uses Django's connection pool with max_size {size}, fewer "
            f"than the {needed} connections a worker process can take from it at once (the "
            f"task's, and {needed - 1} more for a batch of tool calls run together: "
            f"AGENTRUN_TOOL_CONCURRENCY = {needed}).",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['pool']['max_size'] to at least "
            f"{needed} (each process has a pool of its own), or lower "
            "AGENTRUN_TOOL_CONCURRENCY. A handler that waits for a pooled connection waits "
            "up to the pool's timeout (30 s) and fails. The lease heartbeat's connection is "
            "its own, outside the pool: count it in Postgres's max_connections.",
            id="agentrun.W033",
        )
    ]


def settings_messages() -> list[checks.CheckMessage]:
    if not hasattr(settings, "AGENTRUN_PREPARED_STATEMENTS"):
        return []
    return [
        checks.Warning(
            "AGENTRUN_PREPARED_STATEMENTS no longer does anything.",
            hint="Remove it: the engine's write is a function installed by a migration "
            "(agentrun_write), whose plans Postgres keeps, behind any pooler too.",
            id="agentrun.W032",
        )
    ]


def longest_task_seconds() -> float:
    """How long one advance_run task can hold its broker message (late acks), at most,
    without a tool's own time: it starts a turn until AGENTRUN_TASK_SECONDS have passed,
    and a turn's model call may take ANTHROPIC_TIMEOUT per attempt, with MODEL_RETRIES
    retries and their backoff. (A run waiting for an approval holds no message: the task
    that parks it ends.)"""
    s = agentrun_settings
    attempts = s.MODEL_RETRIES + 1
    return float(
        s.TASK_SECONDS
        + s.ANTHROPIC_TIMEOUT * attempts
        + s.MODEL_RETRY_MAX_SECONDS * s.MODEL_RETRIES
    )


# Kombu's default visibility timeout on Redis (and SQS-like transports): one hour.
DEFAULT_VISIBILITY_TIMEOUT = 3600


def broker_messages(conf: Any) -> list[checks.CheckMessage]:
    """The Redis broker's visibility timeout against the lease and the longest task."""
    url = str(conf.broker_url or "")
    options = conf.broker_transport_options or {}
    if not url.startswith(("redis://", "rediss://", "sentinel://")):
        if "visibility_timeout" not in options:
            return []
    visibility = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT)
    lease = agentrun_settings.LEASE_SECONDS
    longest = longest_task_seconds()
    if visibility >= max(lease * 2, longest):
        return []
    return [
        checks.Warning(
            f"The broker's visibility_timeout ({visibility:g} s) is shorter than the longest "
            f"advance_run task ({longest:g} s, before any tool's own time) or twice the lease "
            f"({lease * 2:g} s).",
            hint="Redis gives a message that was not acknowledged within visibility_timeout to "
            "another worker: a task still running is delivered again (the lease makes it "
            "harmless, but a worker is taken for nothing each time). Set "
            "CELERY_BROKER_TRANSPORT_OPTIONS = {'visibility_timeout': N} with N above "
            "AGENTRUN_TASK_SECONDS + ANTHROPIC_TIMEOUT x (MODEL_RETRIES + 1) + your slowest "
            "tool (the default, 3600, is), or lower those settings.",
            id="agentrun.W004",
        )
    ]
