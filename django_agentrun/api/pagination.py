"""Cursor pagination on `created_at`, strict about its parameters.

DRF's CursorPagination answers a cursor it cannot decode with a 404 and filters by
whatever position a hand-made cursor carries (a bad date was a 500); it ignores a
`page_size` it cannot read. Here a bad cursor is a 400 `invalid_cursor`, and a bad
`page_size` a 400 field error (a larger one is capped).
"""

from __future__ import annotations

from base64 import b64decode
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

from .errors import InvalidCursor
from .params import int_param

MAX_PAGE_SIZE = 200


class CreatedAtCursorPagination(CursorPagination):
    page_size = 50
    max_page_size = MAX_PAGE_SIZE
    page_size_query_param = "page_size"
    page_size_query_description = f"Results per page (default 50, at most {MAX_PAGE_SIZE})."
    ordering = "-created_at"

    def get_page_size(self, request: Request) -> int:
        size = int_param(request, self.page_size_query_param, self.page_size, minimum=1)
        return min(size, self.max_page_size)

    def decode_cursor(self, request: Request) -> Cursor | None:
        encoded = request.query_params.get(self.cursor_query_param)
        try:
            if encoded is not None:  # DRF's decode skips characters outside base64
                b64decode(encoded.encode("ascii"), validate=True)
            cursor = super().decode_cursor(request)
        except (ValueError, UnicodeEncodeError, NotFound) as exc:
            raise InvalidCursor() from exc
        if cursor is not None and cursor.position is not None:
            if _position(cursor.position) is None:
                raise InvalidCursor()
        return cursor

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["minimum"] = 1
        return parameters


def _position(value: str) -> datetime | None:
    """The aware datetime a cursor position holds (str() of `created_at`), or None."""
    try:
        parsed = parse_datetime(value)
        if parsed is None or parsed.tzinfo is None:
            return None
        parsed.astimezone(UTC)  # out of range once converted: refuse it here
    except (ValueError, OverflowError):
        return None
    return parsed


class RunPagination(CreatedAtCursorPagination):
    """Newest first; a cursor stays stable while new runs are created."""


class PendingPagination(CreatedAtCursorPagination):
    """Oldest first: the queue of decisions."""

    ordering = "created_at"


class ConversationPagination(CreatedAtCursorPagination):
    """Newest first, like runs."""
