"""Simulated external services for the demo: a messaging provider, a helpdesk, payments.

They keep their own records in JSON-lines files under the demo state directory
(`AGENTRUN_DEMO_DIR`), not in the app's tables, like a third-party API would. The
provider does not deduplicate: sending twice delivers two messages, so only the
runtime's recovery policy stands between a crash and a duplicate. What it offers
is a status check: "did you accept a message with this client reference?".
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATE_DIR_ENV = "AGENTRUN_DEMO_DIR"


def state_dir() -> Path:
    """Where the demo keeps its files (database, broker folders, the services' records)."""
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return Path(configured)
    from django.conf import settings

    return Path(settings.BASE_DIR) / ".demo"


class JsonLines:
    """An append-only file of JSON objects, safe across processes (flock) and crashes (fsync)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock, so check-then-append is atomic across processes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())  # accepted means durable, as a provider's 200 OK would

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)

    def once(self, key: str, row: dict[str, Any]) -> dict[str, Any]:
        """Append `row` under `key`, unless a row with that key is there: return that one."""
        with self.locked():
            for found in self.rows():
                if found["key"] == key:
                    return found
            row = {**row, "key": key, "created_at": _now()}
            self.append(row)
        return row


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class MessagingProvider:
    """Accepts customer messages; remembers each one with the sender's client reference."""

    def __init__(self, root: Path | None = None) -> None:
        self.store = JsonLines((root or state_dir()) / "provider" / "messages.jsonl")

    def send(self, *, to: str, body: str, client_reference: str) -> dict[str, Any]:
        """Deliver a message and return its record. Every call delivers one more message."""
        record = {
            "message_id": f"msg-{uuid.uuid4().hex[:12]}",
            "to": to,
            "body": body,
            "client_reference": client_reference,
            "status": "delivered",
            "accepted_at": _now(),
            "pid": os.getpid(),
        }
        with self.store.locked():
            self.store.append(record)
        return record

    def find(self, client_reference: str) -> dict[str, Any] | None:
        """The status check: the message accepted with this client reference, if any."""
        for record in self.store.rows():
            if record["client_reference"] == client_reference:
                return record
        return None

    def messages(self) -> list[dict[str, Any]]:
        return self.store.rows()

    def reset(self) -> None:
        self.store.reset()


class Helpdesk:
    """Ticket notes; a note is written at most once per key (an idempotent write)."""

    def __init__(self, root: Path | None = None) -> None:
        self.store = JsonLines((root or state_dir()) / "provider" / "ticket_notes.jsonl")

    def add_note(self, *, ticket_id: str, text: str, key: str) -> dict[str, Any]:
        """Add a note to a ticket; with a key seen before, return that note instead."""
        note = {"note_id": f"note-{uuid.uuid4().hex[:8]}", "ticket_id": ticket_id, "text": text}
        return self.store.once(key, note)

    def notes(self) -> list[dict[str, Any]]:
        return self.store.rows()

    def reset(self) -> None:
        self.store.reset()


class Payments:
    """Refunds; one per idempotency key (as a payment provider's idempotency keys do)."""

    def __init__(self, root: Path | None = None) -> None:
        self.store = JsonLines((root or state_dir()) / "provider" / "refunds.jsonl")

    def refund(self, *, order_id: str, amount_cents: int, reason: str, key: str) -> dict[str, Any]:
        """Refund `amount_cents` of an order; with a key seen before, return that refund."""
        refund = {
            "refund_id": f"re-{uuid.uuid4().hex[:8]}",
            "order_id": order_id,
            "amount_cents": amount_cents,
            "reason": reason,
        }
        return self.store.once(key, refund)

    def refunds(self) -> list[dict[str, Any]]:
        return self.store.rows()
