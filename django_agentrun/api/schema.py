"""The API's OpenAPI description: its own AutoSchema, so it needs nothing from the host.

drf-spectacular's `@extend_schema` subclasses DRF's `DEFAULT_SCHEMA_CLASS` as it is
when the views module is imported, so with a host that left it at DRF's default
the schema breaks ("Incompatible AutoSchema"). The views therefore declare each
operation with `@operation(...)` (plain data on the method) and carry
`AgentRunSchema`, which reads it and adds every error status the operation can
answer, with the shared error body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.serializers import ListSerializer

from .serializers import ErrorSerializer

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Operation:
    """What the schema says about one view action beyond what introspection finds."""

    summary: str
    description: str = ""
    request: Any = None
    responses: dict[int, Any] = field(default_factory=dict)
    parameters: tuple[OpenApiParameter, ...] = ()
    # Statuses beyond the common ones, with what they mean here (400, 409...).
    errors: dict[int, str] = field(default_factory=dict)


def operation(**kwargs: Any) -> Callable[[F], F]:
    """Describe a view action for `AgentRunSchema`."""

    def decorate(func: F) -> F:
        func.agentrun_operation = Operation(**kwargs)  # type: ignore[attr-defined]
        return func

    return decorate


# What every status means, whatever the operation; `Operation.errors` adds detail.
ERROR_STATUSES: dict[int, str] = {
    401: "Not authenticated (`not_authenticated`, `authentication_failed`), when the first "
    "authentication class sends a challenge (`WWW-Authenticate`).",
    403: "Not authenticated, when the first authentication class sends no challenge; or "
    "not permitted (`permission_denied`).",
    404: "Not found (`not_found`): no such object among those you may see, or an id of "
    "the wrong form.",
    406: "No renderer for the `Accept` header or `format` parameter (`not_acceptable`).",
    409: "Conflict with the object's current state (`code` says which).",
    413: "The body is larger than Django's `DATA_UPLOAD_MAX_MEMORY_SIZE` (`request_too_large`).",
    415: "The body is not `application/json` (`unsupported_media_type`).",
    429: "Throttled by the host's throttle classes (`throttled`; see `Retry-After`).",
}
BODY_ERRORS = (
    "Malformed JSON, JSON nested too deeply or holding non-finite numbers (`parse_error`); "
    "field errors (`invalid`), NUL characters and unpaired surrogates in any string (keys "
    "included) among them."
)
REUSED_KEY = (
    "The idempotency key was used for a request that asked for something else "
    "(`idempotency_key_reused`): use a new key for a new request."
)
QUERY_ERRORS = "A bad query parameter (`invalid`) or cursor (`invalid_cursor`)."


class AgentRunSchema(AutoSchema):
    """drf-spectacular's AutoSchema, reading `@operation` and documenting every error."""

    def _operation(self) -> Operation | None:
        action = getattr(self.view, "action", None) or self.method.lower()
        return getattr(getattr(self.view, action, None), "agentrun_operation", None)

    def get_summary(self) -> str | None:
        op = self._operation()
        return op.summary if op else super().get_summary()

    def get_description(self) -> str:  # type: ignore[override]
        op = self._operation()
        return op.description if op else super().get_description()

    def get_request_serializer(self) -> Any:
        op = self._operation()
        return op.request if op else super().get_request_serializer()

    def get_override_parameters(self) -> list[Any]:
        op = self._operation()
        if op is None:
            return super().get_override_parameters()
        parameters = list(op.parameters)
        id_type = getattr(self.view, "id_type", None)
        if "{id}" in self.path and id_type is not None:
            # The route takes any segment (so a malformed id is a JSON 404): say what fits.
            parameters.append(OpenApiParameter("id", id_type, OpenApiParameter.PATH))
        return parameters

    def get_response_serializers(self) -> Any:
        op = self._operation()
        if op is None:
            return super().get_response_serializers()
        errors = {code: self._error_text(code) for code in self._error_statuses(op)}
        errors.update(op.errors)
        return {
            **op.responses,
            **{
                code: OpenApiResponse(ErrorSerializer, description=text)
                for code, text in sorted(errors.items())
            },
        }

    def _error_statuses(self, op: Operation) -> list[int]:
        codes = [401, 403, 406]
        if "{" in self.path:
            codes.append(404)
        if self.method == "POST":
            codes += [400, 413, 415]
        elif op.parameters or isinstance(op.responses.get(200), ListSerializer):
            codes.append(400)  # filters, or a paginated list's cursor and page_size
        if self.view.get_throttles():  # the host's DEFAULT_THROTTLE_CLASSES apply
            codes.append(429)
        return codes

    def _error_text(self, code: int) -> str:
        if code == 400:
            return BODY_ERRORS if self.method == "POST" else QUERY_ERRORS
        return ERROR_STATUSES[code]
