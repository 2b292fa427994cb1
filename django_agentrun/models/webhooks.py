"""Webhooks: the subscriptions people manage in the admin, and the outbox.

A `WebhookDelivery` is written in the same transaction as the state change it reports
(store/outbox.py), so no event is lost after a crash and none is sent for a change that
rolled back; a Celery task sends it (webhooks/), and each try is a `WebhookAttempt`.
Subscriptions named in AGENTRUN_WEBHOOKS (settings) live in no table.
"""

from __future__ import annotations

import base64
import secrets
import uuid

from django.db import models
from django.utils import timezone

from ..fields import json_field
from ..permissions import MANAGE_WEBHOOKS_PERMISSION


def new_secret() -> str:
    """A Standard Webhooks signing secret: `whsec_` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def new_webhook_id() -> str:
    """The id receivers deduplicate by (the `webhook-id` header)."""
    return f"msg_{uuid.uuid4().hex}"


class WebhookSubscription(models.Model):
    """A URL that wants some of the events (webhooks.EVENTS; "*" for all), signed with its
    secret. Editable in the admin by users with the manage-webhooks permission."""

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=2000)
    secret = models.CharField(max_length=200, default=new_secret)
    events = json_field(default=list)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            (
                MANAGE_WEBHOOKS_PERMISSION.partition(".")[2],
                "Can manage webhook subscriptions and resend deliveries",
            )
        ]

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    """Not delivered yet: due at `next_attempt_at`."""
    DELIVERED = "delivered", "Delivered"
    """A try was answered 2xx (or the e-mail was handed to the mail backend)."""
    FAILED = "failed", "Failed"
    """Every try of the retry schedule failed, or the URL is not allowed: given up."""


class DeliveryKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    EMAIL = "email", "E-mail to the approvers"


class WebhookDelivery(models.Model):
    """One event for one subscription (or one e-mail), written with the change it reports."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    webhook_id = models.CharField(max_length=40, unique=True, default=new_webhook_id)
    kind = models.CharField(max_length=10, choices=DeliveryKind.choices)
    subscription = models.CharField(max_length=100, blank=True)
    url = models.CharField(max_length=2000, blank=True)
    event_type = models.CharField(max_length=40)
    run_id = models.UUIDField(null=True, db_index=True)
    payload = json_field()
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    cycle = models.PositiveIntegerField(default=1)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A worker that took the delivery holds it until then (a duplicate task leaves it).
    locked_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="agentrun_delivery_due_idx",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} -> {self.subscription or self.kind} ({self.webhook_id})"


class WebhookAttempt(models.Model):
    """One try of a delivery: what the receiver answered, or why there was no answer."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_rows"
    )
    cycle = models.PositiveIntegerField(default=1)
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # At most webhooks.EXCERPT_BYTES of the response body, never more.
    response_excerpt = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "cycle", "number"]

    def __str__(self) -> str:
        return f"attempt {self.cycle}.{self.number}: {self.status_code or self.error[:40]}"
