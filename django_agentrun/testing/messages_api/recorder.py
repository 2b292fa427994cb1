"""What the stand-in saw: the requests, streams cut by the client, script errors.

Shared by the server object (which reads it, and keeps it across stop and start) and
the request handlers (which write to it from their threads).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from .script import step_of


class Recorder:
    """Thread-safe records; every reader gets a copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._disconnects = 0
        self._script_errors: list[BaseException] = []

    def record(
        self, *, method: str, path: str, headers: dict[str, str], body: Any, request_id: str
    ) -> dict[str, Any]:
        """A new request's record; the handler fills in `status` and `error` as it answers."""
        record = {
            "method": method,
            "path": path,
            "headers": headers,
            "body": body,
            "time": time.time(),
            "step": step_of(body) if isinstance(body, dict) else 0,
            "stream": bool(body.get("stream")) if isinstance(body, dict) else False,
            "status": None,
            "error": None,
            "request_id": request_id,
        }
        with self._lock:
            self._requests.append(record)
        return record

    def disconnected(self) -> None:
        with self._lock:
            self._disconnects += 1

    def script_error(self, exc: BaseException) -> None:
        with self._lock:
            self._script_errors.append(exc)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> dict[str, Any]:
        with self._lock:
            if not self._requests:
                raise LookupError("no request recorded")
            return self._requests[-1]

    @property
    def disconnects(self) -> int:
        with self._lock:
            return self._disconnects

    @property
    def script_errors(self) -> list[BaseException]:
        with self._lock:
            return list(self._script_errors)

    def steps(self) -> Counter[int]:
        with self._lock:
            return Counter(
                r["step"] for r in self._requests if r["path"].startswith("/v1/messages")
            )

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self._disconnects = 0
            self._script_errors.clear()
