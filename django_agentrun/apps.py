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
        )

        # Agents live in installed apps' agents.py.
        autodiscover_modules("agents")
