"""The whole of a folded value, as plain text: `<id>/value/<name>/` on a run (its input,
output, metadata, configuration, a turn's content), a tool call (its arguments, original
arguments, result) or an event (its payload, tokens redacted). The object is looked up
through the admin's scoped queryset: what the user may not see is a 404 here too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin.utils import unquote
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path

from .display import json_text


class ValueViewMixin:
    """Adds the value view; `value(obj, name)` returns the value or raises KeyError."""

    values: dict[str, Callable[[Any], Any]] = {}

    def value(self, obj: Any, name: str) -> Any:
        return self.values[name](obj)

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name  # type: ignore[attr-defined]
        return [
            path(
                "<path:object_id>/value/<str:name>/",
                self.admin_site.admin_view(self.value_view),  # type: ignore[attr-defined]
                name=f"{info[0]}_{info[1]}_value",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def value_view(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if obj is None or not self.has_view_permission(request, obj):  # type: ignore[attr-defined]
            raise Http404("No such object.")
        try:
            value = self.value(obj, name)
        except (LookupError, ValueError, ObjectDoesNotExist) as exc:
            raise Http404("No such value.") from exc
        response = HttpResponse(json_text(value), content_type="text/plain; charset=utf-8")
        response["X-Content-Type-Options"] = "nosniff"  # text, never sniffed as HTML
        return response
