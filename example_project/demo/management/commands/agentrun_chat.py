"""`manage.py agentrun_chat`: the chat page with everything it needs, on this machine.

Migrates the database, makes a user who may approve tool calls, then starts a Celery
worker and uvicorn (the ASGI server the live stream needs) and waits; Ctrl-C stops both.
Open http://127.0.0.1:<port>/chat/ and log in. Redis carries Celery's messages and the
model's words as they are written (the conversation's live stream).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_agentrun.testing.processes import Processes

SCRIPTED_CLIENT = "example_project.demo.scripted.DemoChatClient"
ANTHROPIC_CLIENT = "django_agentrun.clients.anthropic.AnthropicModelClient"
QUEUE = "agentrun-chat"


class Command(BaseCommand):
    help = "Serve the chat page (uvicorn and a Celery worker) at http://127.0.0.1:<port>/chat/."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="uvicorn's port (8000).")
        parser.add_argument(
            "--redis-url",
            default=os.environ.get("AGENTRUN_DEMO_REDIS_URL", "redis://127.0.0.1:6379/0"),
            help="Celery's broker and the live streams (redis://127.0.0.1:6379/0).",
        )
        parser.add_argument(
            "--model",
            choices=["auto", "scripted", "anthropic"],
            default="auto",
            help="scripted (offline, streams slowly; a message that mentions a refund asks "
            "for one), anthropic (needs ANTHROPIC_API_KEY), or auto (anthropic when "
            "ANTHROPIC_API_KEY is set).",
        )
        parser.add_argument("--username", default="demo", help="The user to log in as (demo).")
        parser.add_argument("--password", default="demo", help="Its password (demo).")

    def handle(
        self, *, port: int, redis_url: str, model: str, username: str, password: str, **options: Any
    ) -> None:
        import redis

        try:
            redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis does not answer at {redis_url} ({exc}): start one (redis-server) or "
                "pass --redis-url."
            ) from exc
        if model == "auto":
            model = "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "scripted"
        if model == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
            raise CommandError("--model anthropic needs ANTHROPIC_API_KEY.")
        env = {
            "DJANGO_SETTINGS_MODULE": os.environ.get(
                "DJANGO_SETTINGS_MODULE", "example_project.settings"
            ),
            "CELERY_BROKER_URL": redis_url,
            "AGENTRUN_QUEUE": QUEUE,
            "AGENTRUN_MODEL_CLIENT": SCRIPTED_CLIENT if model == "scripted" else ANTHROPIC_CLIENT,
            # Two processes on one SQLite file: take the write lock up front.
            "SQLITE_TRANSACTION_MODE": "IMMEDIATE",
        }
        # Ctrl-C, and a plain kill too (a shell's background job ignores SIGINT).
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        call_command("migrate", verbosity=0)
        self._user(username, password)
        # Their output goes to this terminal; both in sessions of their own, stopped together.
        procs = Processes(None, cwd=settings.BASE_DIR, env=env, die_with_parent=True)
        procs.worker("example_project", QUEUE, pool="prefork", concurrency=2, loglevel="WARNING")
        procs.uvicorn("example_project.asgi:application", port=port, ready_path=None)
        self.stdout.write(
            f"The chat page: http://127.0.0.1:{port}/chat/ (log in as {username} / "
            f"{password}); model: {model}. Ctrl-C stops it."
        )
        try:
            while all(child.alive() for child in procs.procs):
                time.sleep(0.5)
            raise CommandError("uvicorn or the worker exited: see their output above.")
        except KeyboardInterrupt:
            self.stdout.write("Stopping.")
        finally:
            procs.stop_all(grace=20)

    def _user(self, username: str, password: str) -> None:
        """The page's user, allowed to start the agent and approve its tool calls (the API
        asks for both)."""
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_password(password)
            user.save()
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="agentrun", codename__in=["approve_toolcall", "start_run"]
            )
        )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
