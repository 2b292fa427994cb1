"""System checks: misconfigurations that would silently defeat durability."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from .conf import agentrun_settings

REAP_TASK = "django_agentrun.reap"


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


def _celery_conf() -> Any | None:
    try:
        from celery import current_app
    except ImportError:  # pragma: no cover - celery is a dependency
        return None
    return current_app.conf


@checks.register()
def check_celery(app_configs: Any = None, **kwargs: Any) -> list:
    conf = _celery_conf()
    if conf is None:
        return []
    found = []
    if (conf.worker_prefetch_multiplier or 1) > 1:
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
    if not any(entry.get("task") == REAP_TASK for entry in schedule.values()):
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
    visibility = (conf.broker_transport_options or {}).get("visibility_timeout")
    if visibility is not None and visibility < agentrun_settings.LEASE_SECONDS * 2:
        found.append(
            checks.Warning(
                f"broker visibility_timeout ({visibility}s) is shorter than twice the lease.",
                hint="Redelivery of running tasks is harmless (the lease fences them) but wasteful; "
                "keep the visibility timeout well above AGENTRUN_LEASE_SECONDS.",
                id="agentrun.W004",
            )
        )
    return found


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


@checks.register()
def check_agents(app_configs: Any = None, **kwargs: Any) -> list:
    from .agents import registered_agents

    found = []
    for agent in registered_agents().values():
        snapshot_model = agent.model or agentrun_settings.DEFAULT_MODEL
        if (
            agent.budget.max_cost_usd is not None
            and agentrun_settings.price_for(snapshot_model) is None
        ):
            found.append(
                checks.Error(
                    f"Agent {agent.name!r} has a cost budget but model {snapshot_model!r} has no price.",
                    hint="Add it to AGENTRUN_PRICES = {model: {'input': ..., 'output': ..., "
                    "'cache_write': ..., 'cache_read': ...}} (USD per million tokens).",
                    id="agentrun.E004",
                )
            )
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
