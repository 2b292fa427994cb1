"""The chat page: plain HTML and JavaScript over the API (conversations, their live
stream, tool-call decisions), session authentication with CSRF; no build step."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie

from django_agentrun.permissions import APPROVE_PERMISSION

from .agents import AGENT_NAME


@login_required
@ensure_csrf_cookie
def chat(request: HttpRequest) -> HttpResponse:
    """The page; the conversation it shows is in its URL (`?c=<id>`), so a reload keeps it."""
    return render(
        request,
        "demo/chat.html",
        {
            "agent": AGENT_NAME,
            # Where the API is mounted (the page builds its URLs from there).
            "api": reverse("agentrun:conversation-list").removesuffix("conversations/"),
            "may_decide": request.user.has_perm(APPROVE_PERMISSION),
        },
    )
