"""Forking a run from one of its turns, from the run's page: "Fork from this turn" opens a
confirmation page (what is copied, what is asked again, whose run it is); confirming it
POSTs to `services.fork_run` and opens the new run. Who may: the run's owner, or a user
with `agentrun.cancel_run`, whom the agent's start rule lets start it, as in the API
(`services.check_begin`); the fork is theirs."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _

from .. import services
from ..exceptions import AgentRunError
from ..models import Run
from ..permissions import can_act_on_run
from .actions import check_may_act
from .display import change_url


def fork_url(run: Run, turn: int) -> str:
    return reverse("admin:agentrun_run_fork", args=[run.pk]) + f"?turn={turn}"


class ForkViewsMixin:
    """The fork confirmation view of RunAdmin (`fork_template`)."""

    fork_template = "admin/agentrun/run/fork.html"

    def get_urls(self):
        return [
            path(
                "<path:object_id>/fork/",
                self.admin_site.admin_view(self.fork_view),  # type: ignore[attr-defined]
                name="agentrun_run_fork",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def fork_points(self, request: HttpRequest, run: Run) -> dict[int, str]:
        """Turn index -> the URL that forks from it, for the turns a fork may start at
        (none if the user may not fork this run)."""
        if not can_act_on_run(request.user, run):
            return {}
        try:
            services.check_begin(request.user, run, "fork")
        except AgentRunError:
            return {}
        return {p.turn: fork_url(run, p.turn) for p in services.fork_points(run) if p.allowed}

    def fork_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if run is None or not self.has_view_permission(request, run):  # type: ignore[attr-defined]
            raise Http404("No such run.")
        back = HttpResponseRedirect(change_url(run))
        raw = request.POST.get("turn") if request.method == "POST" else request.GET.get("turn")
        try:
            turn = int(raw or "")
            check_may_act(request, run, "fork")
            services.check_begin(request.user, run, "fork")
            points = services.fork_points(run)
            if not 0 <= turn < len(points):
                raise ValueError
            point = points[turn]
            if not point.allowed:
                raise services.ForkRefused(f"it cannot be forked at turn {turn}: {point.reason}.")
            if request.method == "POST":
                fork = services.fork_run(run, at_turn=turn, by=request.user)
        except ValueError:
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("Run %(run)s has no turn %(turn)r to fork from.") % {"run": run.pk, "turn": raw},
                messages.ERROR,
            )
            return back
        except AgentRunError as exc:
            self.message_user(request, f"Run {run.pk}: {exc}", messages.ERROR)  # type: ignore[attr-defined]
            return back
        if request.method == "POST":
            self.log_change(request, run, f"Forked at turn {turn} into run {fork.pk}.")  # type: ignore[attr-defined]
            self.log_addition(request, fork, f"Forked from run {run.pk} at turn {turn}.")  # type: ignore[attr-defined]
            self.message_user(  # type: ignore[attr-defined]
                request,
                _("Forked run %(run)s at turn %(turn)d: this is the new run, queued.")
                % {"run": run.pk, "turn": turn},
                messages.SUCCESS,
            )
            return HttpResponseRedirect(change_url(fork))
        copied = run.tool_calls.filter(turn_index__lt=turn).count()
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "opts": run._meta,
            "original": run,
            "title": _("Fork run %(run)s from turn %(turn)d")
            % {"run": str(run.pk)[:8], "turn": turn},
            "run": run,
            "fork_owner": services.fork_owner(run, request.user),
            "turn": turn,
            "copied_turns": turn,
            "copied_calls": copied,
            "run_url": change_url(run),
        }
        return TemplateResponse(request, self.fork_template, context)
