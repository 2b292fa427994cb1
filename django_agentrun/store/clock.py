"""Time as the database sees it. Leases are set and judged by the database's clock on
Postgres: app servers' clocks differ. SQLite runs on the app's host; its time is the app's."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone

from .sql import sql


def database_now() -> datetime:
    """The database's current time (one query on Postgres)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql("database_now"))
        value = cursor.fetchone()[0]
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)
