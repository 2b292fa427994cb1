"""The chat page: plain HTML and JavaScript over the API (conversations, their live
stream, tool-call decisions), session authentication with CSRF; no build step. Served
with a Content-Security-Policy that allows scripts, styles and connections from this
origin only (no inline script: the page's configuration is JSON data)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie

from django_agentrun.permissions import APPROVE_PERMISSION

from .agents import AGENT_NAME

# Everything from this origin, nothing inline, nothing framing the page.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


@login_required
@ensure_csrf_cookie
def chat(request: HttpRequest) -> HttpResponse:
    """The page; the conversation it shows is in its URL (`?c=<id>`), so a reload keeps it."""
    config = {
        "agent": AGENT_NAME,
        # Where the API is mounted (the page builds its URLs from there).
        "api": reverse("agentrun:conversation-list").removesuffix("conversations/"),
        "mayDecide": request.user.has_perm(APPROVE_PERMISSION),
    }
    response = render(request, "demo/chat.html", {"agent": AGENT_NAME, "config": config})
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response
