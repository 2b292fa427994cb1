"""System checks: misconfigurations that would silently defeat durability."""

from __future__ import annotations

import os
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from . import deploy_checks, model_checks, webhooks
from .access import api_rule
from .conf import agentrun_settings
from .engine.heartbeat import renewal_timing
from .exceptions import ConfigurationError

REAP_TASK = "django_agentrun.reap"
# Celery options the README asks for, read from Django settings with the CELERY_ namespace.
CELERY_SETTINGS = (
    "broker_url",
    "worker_prefetch_multiplier",
    "worker_cancel_long_running_tasks_on_connection_loss",
    "beat_schedule",
    "task_always_eager",
)


@checks.register(checks.Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    found = []
    vendor = connections["default"].vendor
    if vendor not in ("postgresql", "sqlite"):
        found.append(
            checks.Error(
                f"django-agentrun does not support the {vendor!r} database.",
                hint="Use PostgreSQL (or SQLite for development): the engine relies on "
                "UPDATE ... RETURNING and SELECT ... FOR UPDATE SKIP LOCKED.",
                id="agentrun.E001",
            )
        )
    return found


def _celery_app() -> Any | None:
    try:
        from celery import current_app
    except ImportError:  # pragma: no cover - celery is a dependency
        return None
    return current_app


def _is_fallback_app(app: Any) -> bool:
    """True for the app Celery makes up when the project created none (or never imported
    it): `Celery("default", set_as_current=False)`, which knows no Django settings."""
    return app.main == "default" and not app.set_as_current


def _project_package() -> str:
    # The environment first: under override_settings, settings.SETTINGS_MODULE is None.
    module = (
        os.environ.get("DJANGO_SETTINGS_MODULE")
        or getattr(settings, "SETTINGS_MODULE", None)
        or "mysite.settings"
    )
    return module.rpartition(".")[0] or module


def _unread_settings(app: Any) -> tuple[list[str], list[str]]:
    """The Django CELERY_* settings (of those the README asks for) that are set, and those
    of them the app's configuration does not reflect."""
    present, unread = [], []
    for key in CELERY_SETTINGS:
        name = f"CELERY_{key.upper()}"
        if not hasattr(settings, name):
            continue
        if key == "broker_url" and os.environ.get("CELERY_BROKER_URL"):
            continue  # Celery lets the environment variable win over any configuration
        present.append(name)
        if app.conf.get(key) != getattr(settings, name):
            unread.append(name)
    return present, unread


def _no_celery_app() -> checks.CheckMessage:
    package = _project_package()
    return checks.Error(
        "No Celery app is loaded: start_run would send its tasks to Celery's default "
        "broker (amqp://guest@localhost//) and runs would stay queued.",
        hint=f"Create {package}/celery.py with app = Celery({package!r}), "
        "app.config_from_object('django.conf:settings', namespace='CELERY') and "
        f"app.autodiscover_tasks(), and import it in {package}/__init__.py: "
        "from .celery import app as celery_app.",
        id="agentrun.E010",
    )


def _unread_findings(app: Any, present: list[str], unread: list[str]) -> list:
    if not unread:
        return []
    if unread == present:
        return [
            checks.Error(
                f"The Celery app {app.main!r} does not read Django settings: it ignores "
                f"{', '.join(unread)}.",
                hint="Configure it from Django settings in celery.py: "
                "app.config_from_object('django.conf:settings', namespace='CELERY').",
                id="agentrun.E011",
            )
        ]
    return [
        checks.Warning(
            f"The Celery app {app.main!r} overrides these Django settings with other values: "
            f"{', '.join(unread)}.",
            hint="Set each in one place: the values in effect are the Celery app's.",
            id="agentrun.W013",
        )
    ]


@checks.register()
def check_celery(app_configs: Any = None, **kwargs: Any) -> list:
    app = _celery_app()
    if app is None:
        return []
    if _is_fallback_app(app):
        # Nothing else: it would describe Celery's made-up app, not the project's.
        return [_no_celery_app()]
    present, unread = _unread_settings(app)
    # Advice to set a setting that is set but not read would mislead: those are left out.
    return _unread_findings(app, present, unread) + _setting_findings(app.conf, unread)


def _setting_findings(conf: Any, unread: list[str]) -> list:
    found = []
    if not conf.broker_url and "CELERY_BROKER_URL" not in unread:
        found.append(
            checks.Warning(
                "No Celery broker URL is set: tasks go to amqp://guest@localhost//.",
                hint="Set CELERY_BROKER_URL (e.g. 'redis://127.0.0.1:6379/0').",
                id="agentrun.W010",
            )
        )
    if (conf.worker_prefetch_multiplier or 1) > 1 and (
        "CELERY_WORKER_PREFETCH_MULTIPLIER" not in unread
    ):
        found.append(
            checks.Warning(
                f"Celery worker_prefetch_multiplier is {conf.worker_prefetch_multiplier}.",
                hint="Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1: with late acks, prefetched "
                "advance_run messages wait behind a long turn and are redelivered late when the "
                "worker dies.",
                id="agentrun.W001",
            )
        )
    if conf.task_always_eager:
        found.append(
            checks.Warning(
                "CELERY_TASK_ALWAYS_EAGER is on: runs advance inside the caller's process.",
                hint="Turn it off outside tests: eager tasks have no late acks and no redelivery.",
                id="agentrun.W002",
            )
        )
    schedule = conf.beat_schedule or {}
    if "CELERY_BEAT_SCHEDULE" not in unread and not any(
        entry.get("task") == REAP_TASK for entry in schedule.values()
    ):
        found.append(
            checks.Warning(
                "The django-agentrun reaper is not in the Celery beat schedule.",
                hint=(
                    "Add CELERY_BEAT_SCHEDULE = {'agentrun-reap': {'task': "
                    f"'{REAP_TASK}', 'schedule': {agentrun_settings.REAPER_INTERVAL_SECONDS:g}}}}} "
                    "and run celery beat: without it, runs of dead workers wait for "
                    "`manage.py reconcile_runs`."
                ),
                id="agentrun.W003",
            )
        )
    found.extend(deploy_checks.broker_messages(conf))
    if not conf.worker_cancel_long_running_tasks_on_connection_loss and (
        "CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS" not in unread
    ):
        found.append(
            checks.Warning(
                "Celery workers keep running tasks when they lose the broker connection.",
                hint="Set CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True: "
                "the broker redelivers those messages anyway, and the run's lease makes the "
                "redelivery safe.",
                id="agentrun.W011",
            )
        )
    return found


# What a renewal must leave before the watchdog's stop (a round trip, a busy machine).
MIN_RENEWAL_SLACK = 0.25


@checks.register()
def check_deployment(app_configs: Any = None, **kwargs: Any) -> list:
    """Behind a connection pooler; settings that no longer do anything (deploy_checks)."""
    return deploy_checks.database_messages() + deploy_checks.settings_messages()


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    found = []
    s = agentrun_settings
    if s.HEARTBEAT_SECONDS * 3 > s.LEASE_SECONDS:
        found.append(
            checks.Error(
                f"AGENTRUN_HEARTBEAT_SECONDS ({s.HEARTBEAT_SECONDS}) is too long for "
                f"AGENTRUN_LEASE_SECONDS ({s.LEASE_SECONDS}).",
                hint="The heartbeat must renew the lease well inside it: keep it at most a third.",
                id="agentrun.E002",
            )
        )
    renewal, stop = renewal_timing(s.LEASE_SECONDS, s.HEARTBEAT_SECONDS, s.CANCEL_GRACE_SECONDS)
    if stop - renewal < MIN_RENEWAL_SLACK:
        found.append(
            checks.Error(
                f"AGENTRUN_LEASE_SECONDS ({s.LEASE_SECONDS:g}) is too short to be renewed: the "
                f"heartbeat renews it after {renewal:g} s, and a step not renewed by "
                f"{stop:g} s is stopped.",
                hint="Give the lease at least 2 seconds (the default is 30); with this one every "
                "step that takes longer is stopped and its run taken back by the reaper.",
                id="agentrun.E006",
            )
        )
    scan = s.WAKEUP_SCAN_LIMIT
    if isinstance(scan, bool) or not isinstance(scan, int) or scan < 0:
        found.append(
            checks.Error(
                f"AGENTRUN_WAKEUP_SCAN_LIMIT must be a whole number of messages, 0 or more "
                f"(got {scan!r}).",
                hint="The reaper reads at most this many of the broker's messages to know "
                "which wake-ups are lost; 0 makes it count the queue instead.",
                id="agentrun.E040",
            )
        )
    concurrency = s.TOOL_CONCURRENCY
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        found.append(
            checks.Error(
                f"AGENTRUN_TOOL_CONCURRENCY ({concurrency!r}) must be a whole number, at least 1.",
                hint="How many of a turn's tool calls run at once (the default is 8; 1 runs "
                "them one after another).",
                id="agentrun.E026",
            )
        )
    try:
        api_rule("AGENTRUN_API_START", s.API_START)
    except ConfigurationError as exc:
        hint = 'For example "agentrun.start_run" (the default), True or a function of the user.'
        found.append(checks.Error(str(exc), hint=hint, id="agentrun.E007"))
    found += _governor_findings(s)
    found += [
        checks.Error(
            problem,
            hint="See docs/how-to/webhooks.md: {name, url, secret, events} per subscription.",
            id="agentrun.E050",
        )
        for problem in webhooks.problems(s.WEBHOOKS)
    ]
    found += [
        checks.Warning(
            problem,
            hint="A receiver on this machine or your network: add its host (or network) to "
            "AGENTRUN_WEBHOOK_ALLOWED_HOSTS, e.g. ['127.0.0.1'] in development.",
            id="agentrun.W050",
        )
        for problem in webhooks.refused_urls(s.WEBHOOKS, s.WEBHOOK_ALLOWED_HOSTS)
    ]
    try:
        import_string(s.MODEL_CLIENT)
    except ImportError as exc:
        found.append(
            checks.Error(
                f"AGENTRUN_MODEL_CLIENT {s.MODEL_CLIENT!r} cannot be imported: {exc}",
                hint="Give the dotted path of a class implementing the ModelClient protocol.",
                id="agentrun.E003",
            )
        )
    return found


def _governor_findings(s: Any) -> list:
    """The rate-limit governor's settings (docs/how-to/rate-limits.md)."""
    found = []
    url, wait = s.GOVERNOR_URL, s.GOVERNOR_MAX_WAIT_SECONDS
    if url and not str(url).startswith(("redis://", "rediss://", "unix://")):
        found.append(
            checks.Error(
                f"AGENTRUN_GOVERNOR_URL {url!r} is not a Redis URL.",
                hint='Give a redis:// URL, None (the broker\'s Redis) or "" (no governor).',
                id="agentrun.E014",
            )
        )
    if not isinstance(wait, int | float) or not 0 <= wait < s.LEASE_SECONDS / 2:
        found.append(
            checks.Error(
                f"AGENTRUN_GOVERNOR_MAX_WAIT_SECONDS ({wait!r}) must be a number from 0 to "
                f"half the lease ({s.LEASE_SECONDS:g} s).",
                hint="A longer wait parks the run instead of holding the worker (default 0.25).",
                id="agentrun.E015",
            )
        )
    if s.FAIR_SHARE_KEY:
        try:
            import_string(s.FAIR_SHARE_KEY)
        except ImportError as exc:
            found.append(
                checks.Error(
                    f"AGENTRUN_FAIR_SHARE_KEY {s.FAIR_SHARE_KEY!r} cannot be imported: {exc}",
                    hint="Give the dotted path of a function (run) -> str, or None (the owner).",
                    id="agentrun.E016",
                )
            )
    cap, retry = s.MAX_RUNS_PER_KEY, s.CAPPED_RETRY_SECONDS
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        found.append(
            checks.Error(
                f"AGENTRUN_MAX_RUNS_PER_KEY ({cap!r}) must be a whole number of at least 1.",
                hint="None: no cap (the default).",
                id="agentrun.E017",
            )
        )
    if isinstance(retry, bool) or not isinstance(retry, int | float) or not 0 < retry <= 300:
        found.append(
            checks.Error(
                f"AGENTRUN_CAPPED_RETRY_SECONDS ({retry!r}) must be a number of seconds from "
                "0 (excluded) to 300.",
                hint="How long a run over a cap waits before it asks again (default 2).",
                id="agentrun.E018",
            )
        )
    return found


@checks.register()
def check_required_apps(app_configs: Any = None, **kwargs: Any) -> list:
    missing = [
        name
        for name in ("django.contrib.auth", "django.contrib.contenttypes")
        if not apps.is_installed(name)
    ]
    if not missing:
        return []
    return [
        checks.Error(
            f"django-agentrun needs {' and '.join(missing)} in INSTALLED_APPS.",
            hint="Runs have owners and deciders (users), and the admin and the API check "
            "permissions: add " + ", ".join(repr(m) for m in missing) + " to INSTALLED_APPS.",
            id="agentrun.E012",
        )
    ]


def _api_view() -> Any | None:
    """The API's run list view when the project's URLconf mounts the API, else None."""
    from django.urls import NoReverseMatch, resolve, reverse

    try:
        return resolve(reverse("agentrun:run-list")).func
    except NoReverseMatch:
        return None
    except Exception:  # noqa: BLE001 - a broken URLconf is reported by Django's own check
        return None


def _authentication_classes(view: Any) -> list[Any]:
    from rest_framework.settings import api_settings
    from rest_framework.views import APIView

    cls = getattr(view, "cls", None)
    classes = getattr(cls, "authentication_classes", None)
    if cls is None or classes is APIView.authentication_classes:
        # Not chosen by the view: DRF's setting, read now (the class attribute is a
        # copy taken when DRF was imported).
        classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    return list(classes or [])


@checks.register(checks.Tags.urls)
def check_api(app_configs: Any = None, **kwargs: Any) -> list:
    view = _api_view()
    if view is None:
        return []
    from rest_framework.authentication import SessionAuthentication

    found = []
    classes = _authentication_classes(view)
    if not classes:
        found.append(
            checks.Error(
                "The django-agentrun API is mounted but has no authentication class: every "
                "request is anonymous and refused.",
                hint="Set REST_FRAMEWORK['DEFAULT_AUTHENTICATION_CLASSES'], e.g. "
                "['rest_framework.authentication.SessionAuthentication'] for users logged in "
                "to the site, and a token scheme for other clients.",
                id="agentrun.E013",
            )
        )
    uses_sessions = any(
        isinstance(c, type) and issubclass(c, SessionAuthentication) for c in classes
    )
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    if uses_sessions and (
        "django.contrib.auth.middleware.AuthenticationMiddleware" not in middleware
        or not apps.is_installed("django.contrib.sessions")
    ):
        found.append(
            checks.Warning(
                "The django-agentrun API authenticates with sessions, but sessions are not set "
                "up: logged-in users reach it as anonymous.",
                hint="Add 'django.contrib.sessions' to INSTALLED_APPS and SessionMiddleware and "
                "AuthenticationMiddleware to MIDDLEWARE, or use another authentication class.",
                id="agentrun.W012",
            )
        )
    return found


@checks.register()
def check_agents(app_configs: Any = None, **kwargs: Any) -> list:
    """The model table's overrides, and each agent's model and options against it."""
    from .agents import registered_agents

    found = model_checks.table_messages()
    if any(m.level >= checks.ERROR for m in found):
        return found  # the table itself is wrong: nothing below can be judged
    for agent in registered_agents().values():
        found.extend(model_checks.agent_messages(agent))
        found.extend(model_checks.breakpoint_messages(agent))
    return found


# SQLite added UPDATE ... RETURNING, which every engine write relies on, in 3.35.
SQLITE_RETURNING = (3, 35)


@checks.register()
def check_sqlite_version(app_configs: Any = None, **kwargs: Any) -> list:
    found = []
    for alias in connections:
        connection = connections[alias]
        if connection.vendor != "sqlite":
            continue
        # The library the driver is linked against; no connection needed.
        version = tuple(connection.Database.sqlite_version_info)
        if version < SQLITE_RETURNING:
            found.append(
                checks.Error(
                    f"Database {alias!r} is SQLite {'.'.join(map(str, version))}; django-agentrun "
                    "needs 3.35 or later (UPDATE ... RETURNING).",
                    hint="Use PostgreSQL, or a Python built against a newer SQLite (for example "
                    "the pysqlite3-binary package in place of the standard sqlite3 module).",
                    id="agentrun.E005",
                )
            )
    return found


@checks.register()
def check_tool_side_effects(app_configs: Any = None, **kwargs: Any) -> list:
    from .agents import registered_agents

    undeclared = sorted(
        {
            tool.name
            for agent in registered_agents().values()
            for tool in agent.tools.values()
            if not tool.side_effect_declared
        }
    )
    if not undeclared:
        return []
    return [
        checks.Warning(
            f"Tools without a declared side effect: {', '.join(undeclared)}. They count as "
            "non_idempotent: after a crash mid-call they are not re-run but wait for their "
            "reconcile check or a person.",
            hint="Declare it: @tool(side_effect=SideEffect.READ_ONLY) (or IDEMPOTENT_WRITE, "
            "NON_IDEMPOTENT, ATOMIC).",
            id="agentrun.W005",
        )
    ]


@checks.register()
def check_mcp(app_configs: Any = None, **kwargs: Any) -> list:
    """An agent with MCP servers needs the mcp package (imported only when a server is met)."""
    import importlib.util

    from .agents import registered_agents

    agents = sorted(a.name for a in registered_agents().values() if a.mcp_servers)
    if not agents or importlib.util.find_spec("mcp") is not None:
        return []
    return [
        checks.Error(
            f"Agents {', '.join(agents)} take tools from MCP servers, but the mcp package is "
            "not installed: their runs cannot start.",
            hint="pip install 'django-agentrun[mcp]'",
            id="agentrun.E060",
        )
    ]
