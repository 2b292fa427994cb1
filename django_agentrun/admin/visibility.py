"""What a user sees in the admin: the runs the API shows them (`Run.objects.visible_to`:
their own, or all with `agentrun.view_all_runs`; superusers all), and the tool calls and
events of those runs only. Every list, page, action and value view reads through these
querysets, so a run outside them is "not found" on every admin path, as in the API."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

from ..models import Run


def visible_runs(user: Any) -> QuerySet[Run]:
    return Run.objects.visible_to(user)


def scope(queryset: QuerySet[Any], user: Any, path: str) -> QuerySet[Any]:
    """`queryset` (of runs, or of rows whose run is at `path`) cut to the runs `user` sees."""
    runs = visible_runs(user)
    if not runs.query.has_filters():
        return queryset  # every run: no subquery
    if not path:
        return queryset.filter(pk__in=runs.values("pk"))
    return queryset.filter(**{f"{path}__in": runs.values("pk")})


class VisibleRunsMixin:
    """A ModelAdmin whose rows are runs (`run_path` "") or hang off one (`run_path` "run")."""

    run_path = "run"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return scope(super().get_queryset(request), request.user, self.run_path)  # type: ignore[misc]
