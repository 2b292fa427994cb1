"""HTTP Basic authentication for the API that a browser cannot be tricked into using.

A browser keeps Basic credentials once typed and sends them with every request to the
site, a form posted from another site included: DRF's BasicAuthentication does not check
CSRF (it is meant for scripts), so such a form could cancel a run. Here a write
(POST, PUT, PATCH, DELETE) with Basic credentials must either be JSON, a content type a
page on another site cannot send without the CORS preflight this project never allows, or
pass Django's CSRF check as a session's write does. Scripts send JSON, as the API expects.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.authentication import BasicScheme
from rest_framework.authentication import BasicAuthentication, CSRFCheck
from rest_framework.exceptions import PermissionDenied

SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


class BasicAuthenticationWithCSRF(BasicAuthentication):
    def authenticate(self, request: Any) -> Any:
        found = super().authenticate(request)
        if found is not None and request.method not in SAFE_METHODS:
            if request.content_type.split(";")[0].strip().lower() != "application/json":
                enforce_csrf(request)
        return found


def enforce_csrf(request: Any) -> None:
    """Django's CSRF check, as DRF's SessionAuthentication applies it."""

    def dummy_get_response(request: Any) -> None:  # pragma: no cover - never called
        return None

    check = CSRFCheck(dummy_get_response)
    check.process_request(request)
    reason = check.process_view(request, None, (), {})
    if reason:
        raise PermissionDenied(f"CSRF Failed: {reason}")


class BasicWithCSRFScheme(BasicScheme):
    """The OpenAPI document names it as HTTP Basic (drf-spectacular's extension)."""

    target_class = "example_project.demo.auth.BasicAuthenticationWithCSRF"
