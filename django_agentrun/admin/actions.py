"""List actions: they call `services`, report counts and errors, and check permissions.

Django hides an action from a user without its permission but does not refuse it
when posted anyway, and django-fsm-2's admin does not re-check permissions either:
every action here checks its permission itself. A run's owner may cancel and resume it,
as in the API; anyone else needs `agentrun.cancel_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import services
from ..exceptions import AgentRunError
from ..models import Run
from ..permissions import CANCEL_PERMISSION, can_act_on_run
from ..states import RUN_ACTIVE

MAX_LISTED_ERRORS = 10
# An integer id past a bigint names nothing (and some databases cannot even compare it).
MAX_ID = 2**63


def cancel_reason(request: HttpRequest) -> str:
    """The reason typed with a cancel, or one that names who cancelled."""
    reason = request.POST.get("reason", "").strip()
    return reason or f"Cancelled in admin by {request.user.get_username()}"


class NotPermitted(AgentRunError):
    """You may not do this."""

    code = "permission_denied"


class ServiceActionsMixin:
    """Shared plumbing: messages for service errors, refusing actions a user may not run."""

    #: action name -> the permission it needs ("app_label.codename"; each action checks it too).
    guarded_actions: dict[str, str] = {}

    def report_errors(self, request: HttpRequest, errors: list[str]) -> None:
        for text in errors[:MAX_LISTED_ERRORS]:
            self.message_user(request, text, messages.ERROR)
        if len(errors) > MAX_LISTED_ERRORS:
            self.message_user(
                request,
                ngettext(
                    "… and %(count)d more error.",
                    "… and %(count)d more errors.",
                    len(errors) - MAX_LISTED_ERRORS,
                )
                % {"count": len(errors) - MAX_LISTED_ERRORS},
                messages.ERROR,
            )

    def apply_each(
        self,
        request: HttpRequest,
        objects: Iterable[Any],
        apply: Callable[[Any], Any],
        *,
        label: Callable[[Any], str],
        logged: str,
        done_message: tuple[str, str],
    ) -> None:
        """Apply a service to each object: a change-log entry for each one done, one
        message with the count, one error message per refusal (labelled by `label`)."""
        done, errors = 0, []
        for obj in objects:
            try:
                apply(obj)
            except AgentRunError as exc:
                errors.append(f"{label(obj)}: {exc}")
            else:
                done += 1
                self.log_change(request, obj, logged)
        if done:
            self.message_user(
                request,
                ngettext(done_message[0], done_message[1], done) % {"count": done},
                messages.SUCCESS,
            )
        self.report_errors(request, errors)

    def refuse(self, request: HttpRequest, perm: str) -> None:
        self.message_user(
            request,
            _("You do not have permission to do this (%(perm)s needed). Nothing was changed.")
            % {"perm": perm},
            messages.ERROR,
        )

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        if request.method == "POST" and "action" in request.POST:
            # An action hidden from this user (no permission) is refused with a clear message
            # instead of Django's silent "No action selected".
            perm = self.guarded_actions.get(request.POST["action"])
            if perm and not request.user.has_perm(perm):
                self.refuse(request, perm)
                return HttpResponseRedirect(request.get_full_path())
            # Ids that cannot be this model's are a message, not a server error.
            pk = self.model._meta.pk  # type: ignore[attr-defined]
            try:
                for value in request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME):
                    number = pk.to_python(value)
                    if isinstance(number, int) and not 0 < number < MAX_ID:
                        raise ValidationError("out of range")
            except ValidationError:
                self.message_user(
                    request, _("Invalid selection: nothing was changed."), messages.ERROR
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


def _run_label(run: Run) -> str:
    return f"Run {run.pk}"


def check_may_act(request: HttpRequest, run: Run, verb: str) -> None:
    """NotPermitted unless the user owns `run` or has agentrun.cancel_run (as in the API)."""
    if not can_act_on_run(request.user, run):
        raise NotPermitted(
            f"you do not have permission to {verb} it: only its owner or a user with "
            f"{CANCEL_PERMISSION} may. Nothing was changed."
        )


class RunActionsMixin(ServiceActionsMixin):
    """Cancel and resume the selected runs (`cancel_run`, `resume_run`); delete finished ones."""

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        # Offered to whoever sees runs: each run is checked (its owner, or agentrun.cancel_run).
        return request.user.is_active and request.user.is_staff

    @admin.action(description=_("Cancel selected runs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        reason = cancel_reason(request)

        def cancel(run: Run) -> Any:
            check_may_act(request, run, "cancel")
            return services.cancel_run(run, by=request.user, reason=reason)

        self.apply_each(
            request,
            queryset,
            cancel,
            label=_run_label,
            logged="Cancellation requested in the admin.",
            done_message=(
                "Cancellation requested for %(count)d run.",
                "Cancellation requested for %(count)d runs.",
            ),
        )

    @admin.action(description=_("Resume selected runs"), permissions=["cancel"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        def resume(run: Run) -> Any:
            check_may_act(request, run, "resume")
            services.check_begin(request.user, run, "resume")
            return services.resume_run(run, by=request.user)

        self.apply_each(
            request,
            queryset,
            resume,
            label=_run_label,
            logged="Resumed in the admin.",
            done_message=("Resumed %(count)d run.", "Resumed %(count)d runs."),
        )

    def delete_finished(self, request: HttpRequest, queryset: QuerySet[Run]):
        """Django's delete (with its confirmation page), refused while a run is active."""
        active = [
            str(pk) for pk in queryset.filter(state__in=RUN_ACTIVE).values_list("pk", flat=True)
        ]
        if active:
            self.message_user(
                request,
                ngettext(
                    "Run %(runs)s is active: cancel it before deleting it. Nothing was deleted.",
                    "Runs %(runs)s are active: cancel them before deleting them. Nothing was "
                    "deleted.",
                    len(active),
                )
                % {"runs": ", ".join(active[:MAX_LISTED_ERRORS])},
                messages.ERROR,
            )
            return None
        return delete_selected(self, request, queryset)

    def get_actions(self, request: HttpRequest, action_location: Any = None):
        # Django 6.1 passes where the actions show (and warns about an override without the
        # parameter); 5.2 has no such parameter.
        extra = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **extra)  # type: ignore[misc]
        if "delete_selected" in actions:  # the user may delete: finished runs only
            actions["delete_selected"] = (
                type(self).delete_finished,
                "delete_selected",
                _("Delete selected finished runs"),
            )
        return actions
