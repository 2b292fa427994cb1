"""Time as the database sees it. Leases are set and judged by the database's clock on
Postgres: app servers' clocks differ. SQLite runs on the app's host; its time is the app's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from ..models import Run
from .sql import sql


class DatabaseNow:
    """A field value written as the database's current time (see `clock`)."""


def db_value(model: type, name: str, value: Any) -> Any:
    """`value` as the database stores field `name` of `model`."""
    return model._meta.get_field(name).get_db_prep_save(value, connection)


def clock(seconds: float = 0.0) -> tuple[str, list[Any]]:
    """SQL (and its parameters) for the current time plus `seconds`."""
    if connection.vendor == "postgresql":
        if not seconds:
            return sql("now_postgres"), []
        return sql("later_postgres"), [float(seconds)]
    later = timezone.now() + timedelta(seconds=seconds)
    return "%s", [db_value(Run, "lease_expires_at", later)]


def database_now() -> datetime:
    """The database's current time (one query on Postgres)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql("database_now"))
        value = cursor.fetchone()[0]
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)
