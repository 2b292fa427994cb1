"""Webhook subscriptions (editable by users with the manage-webhooks permission) and the
outbox's deliveries (read-only, their tries inline, a resend action)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import ngettext

from .. import webhooks
from ..models import WebhookAttempt, WebhookSubscription
from ..permissions import can_manage_webhooks
from ..webhooks.signing import MIN_SECRET_BYTES, secret_problem
from .display import when


class SubscriptionForm(forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[("*", "every event"), *((e, e) for e in webhooks.ALL_EVENTS)],
        widget=forms.CheckboxSelectMultiple,
    )

    class Meta:
        model = WebhookSubscription
        fields = ["name", "url", "secret", "events", "active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            # Shown once, on the form that creates it (to copy into the receiver); after
            # that the page never carries it: left blank, the secret stays as it is.
            field = self.fields["secret"]
            field.required = False
            field.show_hidden_initial = False  # (a callable default's hidden copy of it)
            field.widget = forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"})
            # The admin renders help text as HTML: the secret's end is escaped.
            field.help_text = format_html(
                "Set; it ends in …{}. Leave blank to keep it, or enter a new one (whsec_ and "
                "the base64 of at least {} random bytes) and give it to the receiver.",
                self.instance.secret[-4:],
                MIN_SECRET_BYTES,
            )

    def clean_secret(self) -> str:
        secret = self.cleaned_data["secret"]
        if not secret and self.instance.pk is not None:
            return self.instance.secret
        problem = secret_problem(secret)
        if problem is not None:
            raise forms.ValidationError(
                f"{problem[0].upper()}{problem[1:]} (or leave the default)."
            )
        return secret


class SubscriptionAdmin(admin.ModelAdmin):
    form = SubscriptionForm
    list_display = ("name", "url", "events", "active", "updated")
    list_filter = ("active",)
    search_fields = ("name", "url")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return can_manage_webhooks(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_manage_webhooks(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return can_manage_webhooks(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_manage_webhooks(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_manage_webhooks(request.user)

    @admin.display(description="updated at", ordering="updated_at")
    def updated(self, obj: Any) -> str:
        return when(obj.updated_at)  # the admin's one date format

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        webhooks.forget_subscriptions()


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "cycle",
        "number",
        "started",
        "duration_ms",
        "status_code",
        "error",
        "response_excerpt",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="started at")
    def started(self, obj: Any) -> str:
        return when(obj.started_at)


@admin.action(description="Resend the selected deliveries (same webhook id)")
def resend(modeladmin: Any, request: HttpRequest, queryset: Any) -> None:
    if not can_manage_webhooks(request.user):
        modeladmin.message_user(request, "You may not resend deliveries.", messages.ERROR)
        return
    count = webhooks.resend(list(queryset))
    modeladmin.message_user(
        request,
        ngettext(
            "%(count)d delivery will be sent again.",
            "%(count)d deliveries will be sent again.",
            count,
        )
        % {"count": count},
        messages.SUCCESS,
    )


class DeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "webhook_id",
        "event_type",
        "kind",
        "subscription",
        "status",
        "attempts",
        "next_try",
        "created",
    )
    list_filter = ("status", "kind", "event_type")
    search_fields = ("webhook_id", "subscription", "url")
    readonly_fields = (
        "webhook_id",
        "kind",
        "subscription",
        "url",
        "event_type",
        "run_id",
        "payload",
        "status",
        "attempts",
        "cycle",
        "next_attempt_at",
        "locked_until",
        "created_at",
        "delivered_at",
        "last_error",
    )
    inlines = [AttemptInline]
    actions = [resend]

    @admin.display(description="next attempt at", ordering="next_attempt_at")
    def next_try(self, obj: Any) -> str:
        return when(obj.next_attempt_at)

    @admin.display(description="created at", ordering="created_at")
    def created(self, obj: Any) -> str:
        return when(obj.created_at)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return can_manage_webhooks(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_manage_webhooks(request.user)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
