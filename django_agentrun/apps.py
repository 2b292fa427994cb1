import atexit
import logging
import threading
from collections.abc import Iterator

from django.apps import AppConfig


class AgentRunConfig(AppConfig):
    name = "django_agentrun"
    label = "agentrun"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import (
            checks,  # noqa: F401 - registers the system checks
            tasks,  # noqa: F401 - registers the tasks (and advance_run with wakeups)
            telemetry,
        )

        # Agents live in installed apps' agents.py.
        autodiscover_modules("agents")
        # The engine's log records carry the run's id, agent and turn (and the trace id).
        names = [n for n in logging.root.manager.loggerDict if n.startswith(self.name)]
        telemetry.install_log_filter([self.name, *names])
        if not getattr(AgentRunConfig, "_observed", False):
            AgentRunConfig._observed = True
            telemetry.observe_approvals(approvals_waiting)
            # Runs before the exit hook of a meter provider made in settings (atexit hooks
            # run last in, first out): its last collection queries nothing.
            atexit.register(telemetry.quiet_at_exit)


def approvals_waiting() -> Iterator[tuple[str, int, float]]:
    """(agent, tool calls waiting for a person, the oldest one's age in seconds): what the
    approval gauges report at each collection (only a host's metrics SDK collects them)."""
    from django.db import connection
    from django.db.models import Count, Min
    from django.utils import timezone

    from .models import ToolCall
    from .states import ToolCallState

    now = timezone.now()
    try:
        rows = (
            ToolCall.objects.filter(
                state__in=(ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)
            )
            .values("run__agent")
            .annotate(n=Count("id"), oldest=Min("created_at"))
            .order_by()
        )
        for row in rows:
            yield row["run__agent"], row["n"], (now - row["oldest"]).total_seconds()
    finally:
        if threading.current_thread() is not threading.main_thread():
            connection.close()  # the exporter's own thread: no connection left open
