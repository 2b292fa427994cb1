"""A conversation: the runs of one thread of messages, in order, with the configuration
they share (its system prompt and tools are fixed for its life) and a status derived from
its runs. The history a follow-up run sends is read from the earlier runs' rows, never
copied into it (the engine's claim reads it, engine/history.py builds it)."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from ..fields import json_field
from ..permissions import VIEW_ALL_PERMISSION
from ..states import ConversationPolicy, ConversationStatus, RunState
from .base import width

# Runs of a conversation that keep it busy (a run waiting for a person makes it `waiting`).
_ADVANCING = (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING_TOOL)


class ConversationQuerySet(models.QuerySet["Conversation"]):
    def visible_to(self, user: Any) -> ConversationQuerySet:
        """Conversations `user` may see: the rule of runs (their own, or all of them with
        the view permission; superusers all)."""
        if user.is_superuser or user.has_perm(VIEW_ALL_PERMISSION):
            return self
        return self.filter(owner=user)

    def with_status(self) -> ConversationQuerySet:
        """Annotated with what `Conversation.status` needs, so a list costs one query."""
        from .runs import Run

        runs = Run.objects.filter(conversation=OuterRef("pk"))
        return self.annotate(
            status_waiting=Exists(runs.filter(state=RunState.AWAITING_APPROVAL)),
            status_busy=Exists(runs.filter(state__in=_ADVANCING)),
            status_last=Subquery(
                runs.order_by("-conversation_position").values("state")[:1],
                output_field=models.CharField(),
            ),
        )


class Conversation(models.Model):
    """A thread of messages to one agent: each message is a run (`Run.conversation`, in
    `Run.conversation_position` order), whose history is the earlier runs' transcripts."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=200, db_index=True)
    config = json_field(
        default=dict,
        help_text="Snapshot of the agent's configuration when the conversation was created: "
        "every run of it uses this one (its system prompt and tools never change).",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_conversations",
    )
    policy = models.CharField(
        max_length=width(ConversationPolicy),
        choices=ConversationPolicy.choices,
        default=ConversationPolicy.ENQUEUE,
        help_text="What becomes of a message sent while a run is active, unless the message "
        "says otherwise.",
    )
    metadata = json_field(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="agentrun_conv_owner_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} conversation {self.id}"

    @property
    def status(self) -> str:
        """idle, busy, waiting (for a person), interrupted or failed: see ConversationStatus.
        From the annotations of `with_status()` when present, else read now."""
        if not hasattr(self, "status_busy"):
            found = type(self).objects.with_status().filter(pk=self.pk).first()
            if found is None:
                return ConversationStatus.IDLE
            self.status_waiting, self.status_busy, self.status_last = (
                found.status_waiting,
                found.status_busy,
                found.status_last,
            )
        return status_of(self.status_waiting, self.status_busy, self.status_last)

    def refresh_status(self) -> None:
        """Forget the status read so far (the next `status` reads it again)."""
        for name in ("status_waiting", "status_busy", "status_last"):
            self.__dict__.pop(name, None)


def status_of(waiting: bool, busy: bool, last: str | None) -> str:
    """A conversation's status from its runs: whether one waits for a person, whether one
    is queued or advancing, and the state of the last one."""
    if waiting:
        return ConversationStatus.WAITING
    if busy:
        return ConversationStatus.BUSY
    if last in (RunState.CANCELLED, RunState.TIMED_OUT):
        return ConversationStatus.INTERRUPTED
    if last == RunState.FAILED:
        return ConversationStatus.FAILED
    return ConversationStatus.IDLE
