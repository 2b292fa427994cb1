"""What a live stream reads from the database, in short synchronous calls run on the event
loop's shared thread pool (`thread_sensitive=False`: no thread per client), each closing
its connection when done (none is held between reads).

A client's first read checks that its user may see the run; the reads that follow (after
each commit's nudge) are the run's, shared by every stream of the process that waits for
the same events: a commit watched by 200 clients costs one read, not 200."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connections
from django.db.models import Max, Q
from django.utils.crypto import constant_time_compare
from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ..models import Conversation, Run, RunEvent, ToolCall, Turn
from ..states import RUN_ACTIVE, RunState
from .errors import error_body
from .serializers import RunEventSerializer

# States in which nothing happens without a person or a new command: a stream ends there.
RESTING = frozenset(
    {
        RunState.COMPLETED,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
        RunState.AWAITING_APPROVAL,
    }
)
PAGE = 500  # events per read

T = TypeVar("T")


def close_connections() -> None:
    """Close this thread's database connections (not one inside a transaction: a test's)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def short_read(func: Callable[..., T]) -> Callable[..., Any]:
    """`func` as a coroutine on the shared thread pool, its connection closed afterwards."""

    @functools.wraps(func)
    def closing(*args: Any, **kwargs: Any) -> T:
        try:
            return func(*args, **kwargs)
        finally:
            close_connections()

    return sync_to_async(closing, thread_sensitive=False)


Refusal = tuple[int, str, str, dict[str, str]]


@short_read
def authenticate(request: Any) -> tuple[Any, str | None, Refusal | None]:
    """(user, its session's key or None, None), or (None, None, the refusal) as the API's
    views decide it: the project's DRF authentication classes in order, then
    IsAuthenticated (401 with the first class's challenge, else 403). The session's key
    when a session authenticated the user: the stream lives only as long as it does."""
    authenticators = [cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]
    drf_request = Request(request, authenticators=authenticators)
    try:
        user = drf_request.user
        if user is not None and user.is_authenticated:
            session = None
            if isinstance(drf_request.successful_authenticator, SessionAuthentication):
                session = getattr(getattr(request, "session", None), "session_key", None)
            return user, session, None
        exc: exceptions.APIException = exceptions.NotAuthenticated()
    except exceptions.APIException as failed:
        exc = failed
    challenge = authenticators[0].authenticate_header(drf_request) if authenticators else None
    body = error_body(exc)
    if challenge and isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return None, None, (401, body["code"], body["detail"], {"WWW-Authenticate": challenge})
    status = 403 if exc.status_code == 401 else exc.status_code
    return None, None, (status, body["code"], body["detail"], {})


@dataclass
class Allowed:
    """What one user may still see, as one re-check found it: the sessions that still sign
    them in, the runs and the conversations (of those asked about) visible to them."""

    sessions: set[str]
    runs: set[Any]
    conversations: set[Any]


@short_read
def allowed(user_id: Any, sessions: set[str], runs: set[Any], conversations: set[Any]):
    """The re-check of all of a user's open streams in a process at once (`Allowed`), or
    None when the user is gone or inactive. The user is read afresh (permissions are not
    cached across checks); a stream a session opened needs that session still theirs
    (`session_valid`)."""
    from django.contrib.auth import get_user_model

    user = get_user_model()._default_manager.filter(pk=user_id).first()
    if user is None or not getattr(user, "is_active", True):
        return None
    found = Allowed({key for key in sessions if session_valid(key, user)}, set(), set())
    if runs:
        found.runs = set(
            Run.objects.visible_to(user).filter(pk__in=runs).values_list("pk", flat=True)
        )
    if conversations:
        found.conversations = set(
            Conversation.objects.visible_to(user)
            .filter(pk__in=conversations)
            .values_list("pk", flat=True)
        )
    return found


def session_valid(key: str, user: Any) -> bool:
    """Whether the session `key` still signs `user` in, as django.contrib.auth's get_user
    decides it on each request (without its side effects): the session exists and has not
    expired (a logout flushed it), names this user and a configured backend that still
    returns them, and carries the auth hash of the user's current password (a password
    changed elsewhere; SECRET_KEY_FALLBACKS too)."""
    from django.contrib import auth

    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    try:
        user_id = user._meta.pk.to_python(store[auth.SESSION_KEY])
        backend_path = store[auth.BACKEND_SESSION_KEY]
    except (KeyError, ValidationError):
        return False
    if user_id != user.pk or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return False
    current = auth.load_backend(backend_path).get_user(user_id)
    if current is None:
        return False
    if not hasattr(current, "get_session_auth_hash"):
        return True
    stored = store.get(auth.HASH_SESSION_KEY)
    if not stored:
        return False
    hashes = [current.get_session_auth_hash()]
    fallbacks = getattr(current, "get_session_auth_fallback_hash", None)
    if fallbacks is not None:
        hashes.extend(fallbacks())
    return any(constant_time_compare(stored, value) for value in hashes)


Cursor = tuple[int, int]  # (a run's position in its conversation, or 0; an event's seq)


@dataclass
class Snapshot:
    """What one read found: the state (a run's; a conversation's last run's), whether
    nothing is active, the newest cursor that exists, the events after the reader's cursor
    (the API's public view of each, at most PAGE) with their cursors, and per position the
    last turn whose answer is recorded (on a stream's first read)."""

    state: str
    resting: bool
    last: Cursor
    events: list[dict[str, Any]] = field(default_factory=list)
    cursors: list[Cursor] = field(default_factory=list)
    more: bool = False
    answered: dict[int, int] = field(default_factory=dict)
    # The last position whose events may be sent yet (a conversation sends a run's events
    # once the runs before it have ended); deltas of a later run wait too.
    frontier: int = 0
    # Its events as this app's own format frames them (by index), made once for all the
    # streams that share this snapshot.
    framed: dict[int, str] = field(default_factory=dict)


def public_events(rows: list[RunEvent], run_id: Any) -> list[dict[str, Any]]:
    events = [dict(e) for e in RunEventSerializer(rows, many=True).data]
    _approval_ids(run_id, events)
    return events


def _page(rows: list[RunEvent]) -> tuple[list[RunEvent], bool]:
    return rows[:PAGE], len(rows) > PAGE


@short_read
def read_run(run_id: Any, user: Any, after: Cursor, *, first: bool = False) -> Snapshot | None:
    """The run as `user` may see it (None: not found or not visible; `user` None: anyone)
    with its events after `after`; bounded by the seq read with its state, so the events
    and the state agree."""
    runs = Run.objects.visible_to(user) if user is not None else Run.objects.all()
    row = runs.filter(pk=run_id).values_list("state", "last_seq").first()
    if row is None:
        return None
    state, last_seq = row
    rows = list(
        RunEvent.objects.filter(run_id=run_id, seq__gt=after[1], seq__lte=last_seq).order_by("seq")[
            : PAGE + 1
        ]
    )
    rows, more = _page(rows)
    answered = {}
    if first:
        found = Turn.objects.filter(run_id=run_id).aggregate(m=Max("index"))["m"]
        answered[0] = -1 if found is None else found
    return Snapshot(
        state,
        state in RESTING,
        (0, last_seq),
        public_events(rows, run_id),
        [(0, e.seq) for e in rows],
        more,
        answered,
    )


@short_read
def read_conversation(
    conversation_id: Any, user: Any, after: Cursor, *, first: bool = False
) -> Snapshot | None:
    """The conversation as `user` may see it (None: not found or not visible; `user` None:
    anyone) with its runs' events after `after`, ordered by (position, seq). A run's events
    are sent once every run before it has ended (the frontier: the first run still active),
    so that nothing can come after a cursor that passed it; each run's are bounded by the
    seq read with its state. It rests when every run rests (none queued or advancing)."""
    found = Conversation.objects.visible_to(user) if user is not None else Conversation.objects
    if not found.filter(pk=conversation_id).exists():
        return None
    runs = list(
        Run.objects.filter(conversation_id=conversation_id)
        .order_by("conversation_position")
        .values_list("pk", "conversation_position", "state", "last_seq")
    )
    if not runs:
        return Snapshot(RunState.COMPLETED, True, (0, 0))
    frontier = next((pos for _, pos, state, _ in runs if state in RUN_ACTIVE), runs[-1][1])
    # The runs between the cursor's and the frontier have ended: all their events; the two
    # at the ends, bounded.
    wanted = Q(
        run__conversation_id=conversation_id,
        run__conversation_position__gt=after[0],
        run__conversation_position__lt=frontier,
    )
    for pk, position, _state, last_seq in runs:
        if position in (after[0], frontier) and after[0] <= frontier:
            since = after[1] if position == after[0] else 0
            wanted |= Q(run_id=pk, seq__gt=since, seq__lte=last_seq)
    rows = list(
        RunEvent.objects.filter(wanted).order_by("run__conversation_position", "seq")[: PAGE + 1]
    )
    rows, more = _page(rows)
    ids = {pk: (str(pk), position) for pk, position, _, _ in runs}
    events: list[dict[str, Any]] = []
    for run_id in dict.fromkeys(e.run_id for e in rows):
        mine = [e for e in rows if e.run_id == run_id]
        for event in public_events(mine, run_id):
            event["run"], event["position"] = ids[run_id]
            events.append(event)
    answered: dict[int, int] = {}
    if first:
        turns = Turn.objects.filter(run__conversation_id=conversation_id)
        per_run = turns.order_by().values_list("run__conversation_position").annotate(Max("index"))
        answered.update(per_run)
    _, position, state, last_seq = runs[-1]
    return Snapshot(
        state,
        all(state in RESTING for _, _, state, _ in runs),
        (position, last_seq),
        events,
        [(ids[e.run_id][1], e.seq) for e in rows],
        more,
        answered,
        frontier,
    )


_shared: dict[tuple[Any, ...], asyncio.Future[Snapshot | None]] = {}


async def read_on(read: Any, ident: Any, after: Cursor) -> Snapshot | None:
    """`read(ident, None, after)` after a stream's first read (visibility was checked then),
    shared by the streams of this event loop that wait for the same events after the same
    cursor. Its result is shared too: nobody may change it."""
    key = (id(asyncio.get_running_loop()), read, ident, after)
    found = _shared.get(key)
    if found is None:
        found = _shared[key] = asyncio.ensure_future(read(ident, None, after))
        found.add_done_callback(lambda _: _shared.pop(key, None))
    # Shielded: one stream that goes away does not cancel the others' read.
    return await asyncio.shield(found)


async def read_first(read: Any, ident: Any, user: Any, after: Cursor) -> Snapshot | None:
    """A stream's first read (`read(ident, user, after, first=True)`: visibility checked),
    shared by the streams of this event loop that open at the same time for the same user,
    source and cursor (2,000 watchers connecting at once cost a read per source, not per
    watcher). Its result is shared too: nobody may change it."""
    key = (id(asyncio.get_running_loop()), read, ident, after, "first", user.pk)
    found = _shared.get(key)
    if found is None:
        found = _shared[key] = asyncio.ensure_future(read(ident, user, after, first=True))
        found.add_done_callback(lambda _: _shared.pop(key, None))
    return await asyncio.shield(found)


def _approval_ids(run_id: Any, events: list[dict[str, Any]]) -> None:
    """An approval request carries its call's API id (`call`: POST tool-calls/{call}/...)."""
    asked = [e for e in events if e["type"] == "approval_requested"]
    if not asked:
        return
    ids = {e["payload"].get("tool_call_id") for e in asked}
    found = dict(
        ToolCall.objects.filter(run_id=run_id, tool_call_id__in=ids).values_list(
            "tool_call_id", "pk"
        )
    )
    for event in asked:
        event["call"] = found.get(event["payload"].get("tool_call_id"))


# Events that say a turn's answer is recorded (its deltas are then superseded).
_ANSWERED = ("model_response", "turn_completed", "turn_cancelled", "turn_failed")


def answered_by(event: dict[str, Any]) -> int:
    """The turn whose answer `event` shows recorded, or -1."""
    if event["type"] in _ANSWERED:
        index = event["payload"].get("turn_index")
        return index if isinstance(index, int) else -1
    return -1
