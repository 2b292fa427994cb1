"""One body for every error the API answers: `{"code", "detail"}`, plus `errors` for
field errors.

- `code`: a stable machine-readable code (`not_found`, `invalid_token`, ...).
- `detail`: a sentence for people.
- `errors` (only with `code` `invalid`): `{field or parameter: [messages]}`;
  errors about the body as a whole are under `non_field_errors`.

The API's views use `exception_handler` as their own (`get_exception_handler`), so
the shape holds whatever the host sets as DRF's `EXCEPTION_HANDLER`. Exceptions it
does not know (a bug, a lost database) stay server errors: Django logs them as 500s.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import set_rollback

from ..exceptions import (
    AgentRunError,
    ApprovalError,
    ConcurrentUpdate,
    IdempotencyConflict,
    InvalidArguments,
    InvalidInput,
    InvalidToken,
    InvalidTransition,
    MCPUnavailable,
    StartRefused,
    UnknownAgent,
)
from ..services import lost_race

# Looked up along the exception's MRO, so a subclass inherits its parent's status.
# Errors not listed (LeaseLost, ConfigurationError...) are server faults: a logged 500.
ERROR_STATUS: dict[type[AgentRunError], int] = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    UnknownAgent: status.HTTP_400_BAD_REQUEST,
    InvalidArguments: status.HTTP_400_BAD_REQUEST,
    InvalidToken: status.HTTP_409_CONFLICT,
    ApprovalError: status.HTTP_409_CONFLICT,
    InvalidTransition: status.HTTP_409_CONFLICT,
    ConcurrentUpdate: status.HTTP_409_CONFLICT,
    # The agent's start rule (services.authority), or another user's credentials.
    StartRefused: status.HTTP_403_FORBIDDEN,
    # A key replayed with another body, as payment APIs answer it.
    IdempotencyConflict: status.HTTP_422_UNPROCESSABLE_ENTITY,
    # An MCP server the agent lists its tools from did not answer: try again later.
    MCPUnavailable: status.HTTP_503_SERVICE_UNAVAILABLE,
}


def status_for(exc: AgentRunError) -> int | None:
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return None


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class InvalidCursor(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Invalid cursor: use the `next` or `previous` link of a page."
    default_code = "invalid_cursor"


class LostRace(exceptions.APIException):
    """A deadlock or serialization failure that reached a view (the services retry their
    own): the state changed under the request."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The run changed while this request was made: read it again and retry."
    default_code = "concurrent_update"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The API's exception handler: every refusal as `{"code", "detail"}`."""
    if isinstance(exc, DatabaseError) and lost_race(exc):
        exc = LostRace()
    if isinstance(exc, AgentRunError):
        code = status_for(exc)
        if code is None:
            return None
        set_rollback()
        return Response({"code": exc.code, "detail": str(exc)}, status=code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()  # its message may name a model: say no more than DRF
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        # Raised by request.body (DATA_UPLOAD_MAX_MEMORY_SIZE); Django would answer an HTML 400.
        exc = RequestTooLarge()
    if not isinstance(exc, exceptions.APIException):
        return None
    headers = {}
    # DRF's APIView.handle_exception decided 401 (with a challenge) or 403 before this.
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))
    set_rollback()
    return Response(error_body(exc), status=exc.status_code, headers=headers)


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    if isinstance(exc, exceptions.ValidationError):
        errors = field_errors(exc.detail)
        return {"code": "invalid", "detail": _summary(errors), "errors": errors}
    code = exc.get_codes()
    return {
        "code": code if isinstance(code, str) else exc.default_code,
        "detail": " ".join(_messages(exc.detail)) or str(exc.default_detail),
    }


def field_errors(detail: Any) -> dict[str, list[str]]:
    """`{field: [messages]}`; nested errors under dotted names, bare ones under
    `non_field_errors` (DRF's `NON_FIELD_ERRORS_KEY`)."""
    if not isinstance(detail, dict):
        return {api_settings.NON_FIELD_ERRORS_KEY: _messages(detail)}
    errors: dict[str, list[str]] = {}
    for field, value in detail.items():
        if isinstance(value, dict):
            for sub, messages in field_errors(value).items():
                errors[f"{field}.{sub}"] = messages
        else:
            errors[str(field)] = _messages(value)
    return errors


def _messages(detail: Any) -> list[str]:
    if isinstance(detail, dict):
        return [m for value in detail.values() for m in _messages(value)]
    if isinstance(detail, list):
        return [m for value in detail for m in _messages(value)]
    return [str(detail)]


def _summary(errors: dict[str, list[str]]) -> str:
    parts = []
    for field, messages in errors.items():
        text = " ".join(messages)
        parts.append(text if field == api_settings.NON_FIELD_ERRORS_KEY else f"{field}: {text}")
    return "; ".join(parts) or "Invalid request."
