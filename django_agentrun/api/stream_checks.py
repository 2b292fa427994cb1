"""The re-check of open live streams, batched: per event loop (one per uvicorn process) and
per user, one check every AGENTRUN_STREAM_RECHECK_SECONDS covers all of that user's open
streams in the process (one short read: the user still there and active, each session that
opened one of them still theirs, and which of the runs and conversations they watch they
may still see), then one renewal of their places (one Redis command). A stream whose check
fails is told at once (`Revoked`, through its inbox) and ends; a check that cannot be made
(the database fails) ends the user's streams too, as the per-stream check did. A stream
opened since the user's last check is checked at the next: within the bound."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from ..conf import agentrun_settings
from ..streams import limits
from ..streams.reader import Inbox, Revoked
from . import stream_reads as reads

logger = logging.getLogger(__name__)


class Watch:
    """One open stream, as its checks see it."""

    __slots__ = ("user_id", "session", "what", "ident", "inbox", "lease", "__weakref__")

    def __init__(
        self, user_id: Any, session: str | None, what: str, ident: Any, inbox: Inbox, lease: Any
    ) -> None:
        self.user_id, self.session, self.what, self.ident = user_id, session, what, ident
        self.inbox, self.lease = inbox, lease

    def allowed(self, found: reads.Allowed | None) -> bool:
        if found is None:
            return False
        if self.session is not None and self.session not in found.sessions:
            return False
        return self.ident in (found.runs if self.what == "run" else found.conversations)


class Checks:
    """A loop's open streams by user, and one task per user that checks them."""

    def __init__(self) -> None:
        self.users: dict[Any, set[Watch]] = {}
        self.tasks: dict[Any, asyncio.Task[None]] = {}
        self.rounds = 0  # checks made (tests, diagnostics)

    def add(self, watch: Watch) -> None:
        self.users.setdefault(watch.user_id, set()).add(watch)
        task = self.tasks.get(watch.user_id)
        if task is None or task.done():
            self.tasks[watch.user_id] = asyncio.ensure_future(self._every(watch.user_id))

    def remove(self, watch: Watch) -> None:
        found = self.users.get(watch.user_id)
        if found is not None:
            found.discard(watch)
            if not found:
                del self.users[watch.user_id]
                task = self.tasks.pop(watch.user_id, None)
                if task is not None and task is not asyncio.current_task():
                    task.cancel()

    async def _every(self, user_id: Any) -> None:
        while True:
            await asyncio.sleep(float(agentrun_settings.STREAM_RECHECK_SECONDS))
            watches = list(self.users.get(user_id, ()))
            if not watches:
                return
            try:
                found = await reads.allowed(
                    user_id,
                    {w.session for w in watches if w.session is not None},
                    {w.ident for w in watches if w.what == "run"},
                    {w.ident for w in watches if w.what == "conversation"},
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - cannot tell: end them, they reconnect
                logger.warning("Live streams: re-check failed (%s) user=%s", exc, user_id)
                found = None
            self.rounds += 1
            kept = []
            for watch in watches:
                if watch.allowed(found):
                    kept.append(watch)
                else:
                    watch.inbox.signal(Revoked())
            await limits.renew_all(
                [w.lease.place for w in kept if getattr(w.lease, "place", None) is not None]
            )


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Checks] = weakref.WeakKeyDictionary()


def checks() -> Checks:
    """The running loop's checks."""
    loop = asyncio.get_running_loop()
    found = _loops.get(loop)
    if found is None:
        found = _loops[loop] = Checks()
    return found


def close_checks() -> None:
    """Stop the running loop's checks (a loop that ends)."""
    found = _loops.pop(asyncio.get_running_loop(), None)
    if found is not None:
        for task in found.tasks.values():
            task.cancel()
        found.tasks.clear()
        found.users.clear()
