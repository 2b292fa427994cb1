"""What the models share: column widths from choices, the generated django-fsm transitions,
the usage counters, the idempotency key."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from django.db import models
from django_fsm import FSMField, transition

from ..clients.base import USAGE_KEYS
from ..states import (
    sources_of,
)


def width(choices: type[models.TextChoices]) -> int:
    return max(len(value) for value in choices.values)


def transition_to(field: FSMField, table: dict[str, frozenset[str]], target: str) -> Any:
    """The django-fsm transition to `target`, its sources read from `table` (states.py).

    It changes the state in memory only; transitions.py persists it with its event."""

    def method(self: Any) -> None:
        pass

    method.__name__ = method.__qualname__ = f"to_{target}"
    method.__doc__ = f"Move to {target!r} (in memory; saved by services)."
    return transition(field=field, source=sources_of(table, target), target=target)(method)


def idempotency_key_for(run_id: uuid.UUID | str, tool_call_id: str) -> str:
    """sha256(run_id + tool_call_id), hex: the key a tool passes to the outside world."""
    return hashlib.sha256(f"{run_id}{tool_call_id}".encode()).hexdigest()


class UsageCounts(models.Model):
    """The four token counters, named like the API's usage keys."""

    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True

    def usage(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in USAGE_KEYS}
