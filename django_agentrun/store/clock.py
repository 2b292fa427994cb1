"""Time as the database sees it. Leases are set and judged by the database's clock on
Postgres: app servers' clocks differ. SQLite runs on the app's host; its time is the app's."""

from __future__ import annotations

from datetime import datetime

from .backend import chosen


def database_now() -> datetime:
    """The database's current time (one query on Postgres)."""
    return chosen().now()
