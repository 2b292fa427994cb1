"""Typed settings with defaults, from Django settings (AGENTRUN_<NAME>).

Each is read from django.conf.settings once and kept until an AGENTRUN_* setting changes
(Django's `setting_changed`), so pytest-django's `settings` fixture and override_settings
just work, and a read on the engine's hot path is an attribute read.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Lease held by the worker advancing a run; the heartbeat renews it.
    "LEASE_SECONDS": 30.0,
    # How often the heartbeat polls for cancel requests and renews the lease.
    "HEARTBEAT_SECONDS": 0.5,
    # Suggested period of the beat-scheduled reaper.
    "REAPER_INTERVAL_SECONDS": 10.0,
    # A queued or released run nobody claimed for this long (at most the lease), while no
    # message waits in its queue, lost its wake-up: the reaper sends another.
    "QUEUED_STALE_SECONDS": 10.0,
    # How the reaper knows such a run's wake-up is lost, not waiting behind a backlog nor
    # still being published: it reads the broker's messages (Redis: the queue, the
    # delivered, unacknowledged ones, and the wake-ups a commit announced before publishing
    # them; wakeups.waiting_runs) and re-sends only a run whose message is in none, at most
    # this many messages per pass. 0, more messages, or a broker it cannot read (RabbitMQ):
    # it counts the queue instead, and re-sends while messages wait only after ten leases.
    "WAKEUP_SCAN_LIMIT": 100_000,
    # One advance_run task goes on with a run's next turn in the same process, holding its
    # lease and its history, for at most this many seconds or turns; then it hands the run
    # back to the queue, so that runs share the workers fairly (with a real model the
    # seconds come first; the turns bound only fast, cheap turns).
    "TURNS_PER_TASK": 50,
    "TASK_SECONDS": 30.0,
    # How many of one turn's tool calls run at once: the calls the model asked for together
    # that are safe to run again (read-only, idempotent writes) run as a batch, on this many
    # threads; 1 runs every call alone, one after another.
    "TOOL_CONCURRENCY": 8,
    # Deprecated, no effect (0.4): the engine's write is a function installed by a migration,
    # whose plans Postgres keeps per connection, behind any pooler (check agentrun.W032).
    "PREPARED_STATEMENTS": True,
    # Rows the reaper handles per batch.
    "REAPER_BATCH_SIZE": 100,
    # After this many crash recoveries the run fails with recovery_exhausted.
    "MAX_RECOVERY_ATTEMPTS": 5,
    # SIGTERM to SIGKILL grace for ctx.run_subprocess on cancel.
    "CANCEL_GRACE_SECONDS": 5.0,
    # Prompts, answers, tool arguments and results in spans (telemetry.py): True or False;
    # None follows OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (off when unset).
    "TELEMETRY_CAPTURE_CONTENT": None,
    # Dotted path to the model client class (or factory).
    "MODEL_CLIENT": "django_agentrun.clients.anthropic.AnthropicModelClient",
    # SDK retries inside a worker (keep low: the engine does bounded, cancellable backoff).
    "ANTHROPIC_MAX_RETRIES": 0,
    # Seconds before the SDK gives up on one request.
    "ANTHROPIC_TIMEOUT": 300.0,
    # Engine-level retries of a retryable model error (5xx, connection); a 429 or 529 parks
    # the run instead (the rate-limit governor; docs/how-to/rate-limits.md).
    "MODEL_RETRIES": 3,
    # Backoff bounds for those retries (seconds).
    "MODEL_RETRY_BASE_SECONDS": 1.0,
    "MODEL_RETRY_MAX_SECONDS": 30.0,
    # A turn the API refuses for a limit (429, 529) more often than this fails
    # (`rate_limited`); each refusal parks the run for the wait the API states.
    "MODEL_RATE_LIMIT_PARKS": 20,
    # The rate-limit governor (clients/governor.py; docs/how-to/rate-limits.md): the Redis
    # server every worker shares the account's limits through. None takes Celery's broker
    # URL when it is Redis; "" turns it off (each process then sends as it likes).
    "GOVERNOR_URL": None,
    # A request the limits allow within this many seconds waits for it in the worker (the
    # pacing); a longer wait parks the run (its lease and slot given back) until then.
    "GOVERNOR_MAX_WAIT_SECONDS": 0.25,
    # Seconds the governor's Redis keys live after their last use.
    "GOVERNOR_TTL_SECONDS": 3600,
    # The fair share: the key runs share the account's limits by. None: the run's owner;
    # else a dotted path to a function (run) -> str (a tenant, say).
    "FAIR_SHARE_KEY": None,
    # Conversation messages (a person waits) go ahead of background runs.
    "FAIR_SHARE_INTERACTIVE_FIRST": True,
    # A background run that has waited this many seconds for the limit goes as if it were
    # interactive: steady interactive load never starves it.
    "FAIR_SHARE_AGING_SECONDS": 30.0,
    # At most this many runs of one fair-share key worked at once (holding a lease), across
    # every worker; None: no cap. An Agent's max_concurrent_runs caps its runs likewise.
    "MAX_RUNS_PER_KEY": None,
    # A run over a cap waits this many seconds (with jitter) before it asks again, unless a
    # run of its key or agent ends its stretch first and wakes it.
    "CAPPED_RETRY_SECONDS": 2.0,
    # Defaults for agents that do not say otherwise.
    # A current model of the table (django_agentrun/catalog/; docs/reference/models.md).
    "DEFAULT_MODEL": "claude-sonnet-5-5",
    "DEFAULT_MAX_TOKENS": 4096,
    "DEFAULT_MAX_TURNS": 20,
    "DEFAULT_MAX_TOOL_CALLS_PER_TURN": 16,
    "REPEAT_THRESHOLD": 3,
    "REPEAT_WINDOW": 10,
    # Prompt caching of the stable prefix (tools and system).
    "PROMPT_CACHING": True,
    # The model table's overrides and additions: {model id: partial entry} merged over the
    # shipped entry (catalog/); a new id names every field or `like` a shipped model.
    "MODELS": {},
    # The JSON file `manage.py agentrun_models refresh` writes the Models API's
    # capabilities to, and every process reads (None: the shipped table only).
    "MODELS_FILE": None,
    # How often (seconds) a process looks at that file's mtime: the merged table is kept
    # between looks, and merged again only when the file changed.
    "MODELS_FILE_CHECK_SECONDS": 3.0,
    # Deprecated: per-model prices {model: {input, output, cache_write, cache_read}}; read
    # as AGENTRUN_MODELS = {model: {"prices": {...}}} (cache_write is the 5-minute price).
    "PRICES": {},
    # Who may start runs of an agent through the API when the agent says nothing
    # (Agent(api_start=...)): a permission name, True (any authenticated user), False
    # (nobody) or a callable (user) -> bool.
    "API_START": "agentrun.start_run",
    # Celery queue for the app's tasks (None: the default queue).
    "QUEUE": None,
    # Max age (seconds) of an approval token: a decision on a page shown longer ago than
    # this is refused (reload it). None: no expiry beyond the call's state.
    "APPROVAL_TOKEN_MAX_AGE": 3600,
    # Live streams (GET .../stream/). The Redis server the model's deltas and commit nudges
    # go through: None takes Celery's broker URL when it is redis:// or rediss://; "" (or
    # a broker that is not Redis) turns deltas off: the streams then show durable events,
    # read from the database every STREAM_POLL_SECONDS.
    "STREAM_URL": None,
    # Prefix of the Redis keys (one stream per run: <prefix>:run:<id>).
    "STREAM_PREFIX": "agentrun:stream",
    # Entries kept per run's Redis stream (XADD MAXLEN ~), and seconds it lives after its
    # last entry.
    "STREAM_MAXLEN": 10000,
    "STREAM_TTL_SECONDS": 3600,
    # Deltas a process holds for its publishing thread; past that they are dropped (a turn
    # is never slowed down by its watchers).
    "STREAM_QUEUE_SIZE": 10000,
    # A comment line this often keeps idle streams open through proxies.
    "STREAM_KEEPALIVE_SECONDS": 15.0,
    # How often a stream reads the database without Redis (with Redis, after each commit's
    # nudge, and every 10 x this as a safety net).
    "STREAM_POLL_SECONDS": 1.0,
    # A stream ends after this many seconds (the client reconnects with its cursor and is
    # authenticated and checked again). None: no bound under ASGI; under WSGI, where each
    # stream holds a worker thread, streams end after STREAM_WSGI_MAX_SECONDS.
    "STREAM_MAX_SECONDS": 300.0,
    "STREAM_WSGI_MAX_SECONDS": 60.0,
    # How often an open stream checks again that its user is active and may see what it
    # follows (it ends at once when not).
    "STREAM_RECHECK_SECONDS": 5.0,
    # Streams one user may hold open at once (across web processes, counted in Redis when
    # the streams have it; per process without); one more is answered 429. None: no limit.
    "STREAM_MAX_PER_USER": 20,
    # Deltas held for a client that does not read them; past that its stream ends (it
    # reconnects with its cursor), so a stalled client costs a bounded amount of memory.
    "STREAM_BUFFER_ENTRIES": 2000,
    # Webhooks (docs/how-to/webhooks.md). Subscriptions from settings: a list of
    # {"name", "url", "secret" (whsec_...), "events": [...] ("*": all)}; more in the admin.
    "WEBHOOKS": [],
    # How long a process keeps the admin's subscriptions before it reads them again; None:
    # never read them (the subscriptions of settings only).
    "WEBHOOK_SUBSCRIPTIONS_CACHE_SECONDS": 5.0,
    # Host names, addresses or networks (CIDR) a webhook may go to although they are
    # private, loopback, link-local or reserved (none by default).
    "WEBHOOK_ALLOWED_HOSTS": [],
    # Seconds one try may take (connect, send, the answer's first KB).
    "WEBHOOK_TIMEOUT_SECONDS": 10.0,
    # Seconds before each retry after the first try (Standard Webhooks' schedule: 5 s,
    # 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; about 27.6 h in all), each stretched by up to
    # WEBHOOK_RETRY_JITTER of itself at random. Then the delivery is given up (failed).
    "WEBHOOK_RETRY_SECONDS": [5, 300, 1800, 7200, 18000, 36000, 36000],
    "WEBHOOK_RETRY_JITTER": 0.2,
    # A delivery due this long ago that no worker holds lost its task: the reaper's pass
    # sends another.
    "WEBHOOK_LOST_AFTER_SECONDS": 30.0,
    # The admin's address as people reach it ("https://ops.example.com"): an approval's
    # webhook and e-mail then carry a link to the call's decision page.
    "WEBHOOK_ADMIN_URL": None,
    # E-mail the users who may approve (agentrun.approve_toolcall) when a call waits for
    # approval or its outcome is unknown, through Django's mail, from the same outbox.
    "APPROVAL_EMAILS": False,
}


class AgentRunSettings:
    """Attribute access to AGENTRUN_* settings, with defaults. A value is read from Django's
    settings once and kept as an attribute (later reads are plain attribute reads, as DRF's
    api_settings does) until an AGENTRUN_* setting changes (Django's `setting_changed`:
    override_settings, pytest-django's `settings`)."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown django-agentrun setting: AGENTRUN_{name}")
        value = getattr(django_settings, f"AGENTRUN_{name}", DEFAULTS[name])
        self.__dict__[name] = value
        return value

    def reload(self) -> None:
        """Forget the values read: the next read of each asks Django's settings again."""
        self.__dict__.clear()


agentrun_settings = AgentRunSettings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("AGENTRUN_"):
        agentrun_settings.reload()


setting_changed.connect(_setting_changed, dispatch_uid="django_agentrun.conf")
