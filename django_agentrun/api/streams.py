"""`GET runs/{id}/stream/` and `GET conversations/{id}/stream/`: the live streams of a run
and of a conversation (its runs in order), Server-Sent Events (formats in sse.py and ui_messages.py).

A plain async Django view (DRF has no async views), so under ASGI a stream holds no thread
while it waits: it checks the API's own authentication (the project's DRF authentication
classes, session included) and visibility (`visible_to(user)` of runs or of
conversations: 404 for what one may not see), reads the database only in short calls on
a shared thread pool that close their connection (none is held between reads), lets go
of the thread Django gave the request for its synchronous parts, and waits on the run's
(or conversation's) Redis stream (`XREAD BLOCK`) for deltas and for the nudge each commit
sends (one read per nudge for all the process's streams of it); without Redis it reads
the database every AGENTRUN_STREAM_POLL_SECONDS.

Bounds: the user is checked again (still active, still allowed to see it, and for a
stream a session opened, that session still theirs: not logged out, expired, nor signed
by a password changed since) every AGENTRUN_STREAM_RECHECK_SECONDS, and the stream ends
at once when not; it lives at most
AGENTRUN_STREAM_MAX_SECONDS, then ends without its end (the client reconnects with its
cursor); a user holds at most AGENTRUN_STREAM_MAX_PER_USER streams (429 beyond); a client
that does not read is let go once AGENTRUN_STREAM_BUFFER_ENTRIES deltas wait for it.
Under WSGI (runserver, gunicorn's sync workers) the same stream is served as a synchronous
iterator on an event loop of its own, so it streams there too, but holds a worker thread
for its life: bounded by AGENTRUN_STREAM_WSGI_MAX_SECONDS.

Resuming: `Last-Event-ID` (what EventSource sends) or `?after=` names the last durable
event received (a seq; in a conversation, `<position>-<seq>`); the stream sends what
followed, never anything twice, then the current turn's deltas from the start of its
answer. A run that rests (completed, failed, cancelled, timed out, or waiting for a
person) ends its stream once everything is sent (a conversation's, once every run of it
rests); with nothing after the cursor it answers 204 (EventSource stops reconnecting; the
AI SDK reads "no active stream"). A client that disconnects cancels nothing. `HEAD` answers
at once with the headers a `GET` would start with (it opens no stream, takes no place);
any other method is a JSON 405 (the views are exempt from CSRF: they change nothing).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from .. import streams
from ..conf import agentrun_settings
from ..streams import limits
from ..streams.reader import Gap, Inbox, Revoked, RunDeltas, SlowReader, client, close_hub
from . import stream_reads as reads
from .sse import KEEPALIVE, EventsFormat
from .stream_checks import Watch, checks, close_checks
from .stream_formats import ACCEPT, CONVERSATION_FORMATS, FORMATS
from .stream_serving import Lease, SyncStream, release_request_thread

logger = logging.getLogger(__name__)

# How much more seldom a stream with Redis reads the database on its own (between nudges).
SAFETY_POLL_FACTOR = 10


def error(status: int, code: str, detail: str, headers: dict[str, str] | None = None):
    response = JsonResponse({"code": code, "detail": detail}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def choose_format(request: HttpRequest) -> str | None:
    """`?format=` (events, ai-sdk), else the Accept header; None: nothing acceptable."""
    named = request.GET.get("format")
    if named is not None:
        return named if named in FORMATS else None
    accept = request.headers.get("Accept", "")
    types = [part.split(";")[0].strip().lower() for part in accept.split(",") if part.strip()]
    for media_type in types:
        if media_type in ACCEPT:
            return ACCEPT[media_type]
    if not types or any(t in ("*/*", "text/*") for t in types):
        return "events"
    return None


def preflight(request: HttpRequest) -> tuple[str | None, HttpResponse | None]:
    """The format asked for, or the refusal (405, 406)."""
    if request.method not in ("GET", "HEAD"):
        return None, error(
            405,
            "method_not_allowed",
            f'Method "{request.method}" not allowed.',
            {"Allow": "GET, HEAD"},
        )
    fmt = choose_format(request)
    if fmt is None:
        return None, error(
            406,
            "not_acceptable",
            "A stream is text/event-stream: ?format=events or ?format=ai-sdk.",
        )
    return fmt, None


def cursor_value(request: HttpRequest) -> str | None:
    """`Last-Event-ID` (what EventSource sends on reconnecting) wins over `?after=`."""
    return request.headers.get("Last-Event-ID") or request.GET.get("after")


def bad_cursor(exc: Exception) -> HttpResponse:
    return JsonResponse(
        {"code": "invalid", "detail": f"after: {exc}.", "errors": {"after": [str(exc)]}},
        status=400,
    )


@csrf_exempt  # reads only: a POST is the JSON 405, not the CSRF page
async def run_stream(request: HttpRequest, pk: str) -> HttpResponse:
    """The live stream of run `pk` (see the module's docstring)."""
    return await _open(
        request,
        pk,
        "run",
        lambda value: (0, streams.parse_run_cursor(value)),
        lambda ident: Source(ident, reads.read_run, streams.run_key(ident), lambda c: str(c[1])),
        FORMATS,
    )


@csrf_exempt
async def conversation_stream(request: HttpRequest, pk: str) -> HttpResponse:
    """The live stream of conversation `pk`: its runs one after the other, each durable
    event's id `<position>-<seq>`; it follows the conversation from run to run (a message
    queued or interrupting continues on it) and ends when every run rests."""
    return await _open(
        request,
        pk,
        "conversation",
        streams.parse_conversation_cursor,
        lambda ident: Source(
            ident,
            reads.read_conversation,
            streams.conversation_key(ident),
            lambda c: streams.conversation_cursor(*c),
        ),
        CONVERSATION_FORMATS,
    )


async def _open(
    request: HttpRequest, pk: str, what: str, parse: Any, source_of: Any, formats: dict[str, Any]
) -> HttpResponse:
    fmt, refused = preflight(request)
    if refused is not None:
        return refused
    try:
        after = parse(cursor_value(request))
    except streams.InvalidCursor as exc:
        return bad_cursor(exc)
    asgi = isinstance(request, ASGIRequest)
    if asgi:
        # The middleware's work is done: the thread Django keeps for it goes now, not once
        # the body starts (2,000 watchers connecting at once held 2,000 threads meanwhile).
        release_request_thread()
    user, session, refusal = await reads.authenticate(request)
    if refusal is not None:
        return error(*refusal)
    try:
        ident = uuid.UUID(pk)
    except ValueError:
        return error(404, "not_found", f"No such {what}.")
    source = source_of(ident)
    source.what, source.user_id, source.session = what, user.pk, session
    first = await reads.read_first(source.read, ident, user, after)
    if first is None:
        return error(404, "not_found", f"No such {what}.")
    if first.resting and not first.events:
        return HttpResponse(status=204)
    if request.method == "HEAD":
        return with_headers(HttpResponse(), formats[fmt](ident))
    lease = Lease(asgi)
    place = await limits.take(user.pk, lease.lapse)
    if not asgi:
        await close_hub()  # this loop ends with the view: the stream runs on its own
        close_checks()
    if place is None:
        limit = agentrun_settings.STREAM_MAX_PER_USER
        return error(
            429,
            "throttled",
            f"At most {limit} open streams per user: close one first.",
            {"Retry-After": str(max(1, round(float(agentrun_settings.STREAM_RECHECK_SECONDS))))},
        )
    lease.place = place
    return respond(formats[fmt](ident), source, after, first, lease)


class Source:
    """What a stream follows: a run, or a conversation (its runs in order)."""

    def __init__(self, ident: Any, read: Any, key: str, cursor_text: Any) -> None:
        self.ident = ident
        self.read = read  # read(ident, user or None, after cursor, first=...) -> Snapshot
        self.key = key  # its Redis stream
        self.cursor_text = cursor_text  # the SSE id of a cursor
        self.what = "run"  # run | conversation
        self.user_id: Any = None  # whose stream it is (checked again while it is open)
        self.session: str | None = None  # the session that opened it, if one did


def respond(
    fmt: Any, source: Source, after: reads.Cursor, first: reads.Snapshot, lease: Lease
) -> HttpResponse:
    """The stream: an async iterator under ASGI, a synchronous one under WSGI."""
    body = _stream(fmt, source, after, first, lease)
    content = body if lease.asgi else SyncStream(body, lease)
    return with_headers(StreamingHttpResponse(content), fmt)


def with_headers(response: HttpResponse, fmt: Any) -> HttpResponse:
    """`response` with a stream's headers (a HEAD's has them too, and no body)."""
    response["Content-Type"] = "text/event-stream; charset=utf-8"
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response["Vary"] = "Accept, Cookie, Authorization"
    for name, value in fmt.headers.items():
        response[name] = value
    return response


async def _stream(
    fmt: Any, source: Source, after: reads.Cursor, snapshot: reads.Snapshot, lease: Lease
) -> AsyncIterator[str]:
    """The stream's body: what each round brings (the durable events read, the live deltas
    that came) sent as one chunk, the same bytes as frame by frame, in one send."""
    inbox = Inbox(int(agentrun_settings.STREAM_BUFFER_ENTRIES))
    watch = Watch(source.user_id, source.session, source.what, source.ident, inbox, lease)
    deltas: RunDeltas | None = None
    registered = None
    try:
        if lease.asgi:
            release_request_thread()
        hub = client()
        entries: list[Any] = []
        if hub is not None:
            deltas = RunDeltas(hub, source.key, inbox)
            entries = await deltas.catch_up()
        registered = checks()
        registered.add(watch)
        follow = Following(fmt, source, after, snapshot, deltas, lease, inbox)
        out = list(fmt.open())
        async for chunk in _follow(follow, snapshot, entries, out):
            yield chunk
    finally:
        if registered is not None:
            registered.remove(watch)
        inbox.close()
        if deltas is not None:
            deltas.close()
        await lease.release()


async def _follow(
    follow: Following, snapshot: reads.Snapshot | None, entries: list[Any], out: list[str]
) -> AsyncIterator[str]:
    """Each round: the durable events read (the first snapshot, then whatever a nudge or
    the timer asks for), the live deltas that came, the stream's bounds, then a read of
    the database or a wait for what comes next."""
    fmt, source, lease = follow.fmt, follow.source, follow.lease
    while True:
        if snapshot is not None:
            out.extend(follow.events(snapshot))
            if follow.ended:
                yield "".join(out)
                return
            snapshot = None
        out.extend(follow.live(entries))
        entries = follow.held
        if out:
            yield "".join(out)
            out = []
        now = follow.loop.time()
        if now >= lease.ends_at:
            # Its time is up: end it without its end, so that the client reconnects after
            # the last cursor it received (and is authenticated and checked again).
            yield "".join(fmt.pause(source.cursor_text(follow.cursor)))
            return
        if follow.need_db or now >= follow.next_poll:
            snapshot = await reads.read_on(source.read, source.ident, follow.cursor)
            if snapshot is None:
                return  # deleted
            continue
        if now - follow.last_output >= follow.keepalive:
            yield KEEPALIVE
            follow.last_output = now
        try:
            entries = await follow.wait(now, entries)
        except SlowReader:
            # More waited for this client than it may hold: let it go (it reconnects).
            logger.info("Live stream ended: the client reads too slowly key=%s", source.key)
            yield "".join(fmt.pause(source.cursor_text(follow.cursor)))
            return
        except Revoked:
            logger.info("Live stream ended: no longer visible key=%s", source.key)
            return


class Following:
    """What a stream has sent (the cursor: the last durable event; each run's last answered
    turn; the turns whose deltas it sent) and when it reads the database next."""

    def __init__(
        self,
        fmt: Any,
        source: Source,
        cursor: reads.Cursor,
        snapshot: reads.Snapshot | None,
        deltas: RunDeltas | None,
        lease: Lease,
        inbox: Inbox | None = None,
    ) -> None:
        self.fmt, self.source, self.deltas, self.lease = fmt, source, deltas, lease
        # Where the hub's entries and the stream's signals (Revoked) come.
        if inbox is None:
            inbox = deltas.inbox if deltas is not None else Inbox(1)
        self.inbox = inbox
        self.loop = asyncio.get_running_loop()
        self.keepalive = float(agentrun_settings.STREAM_KEEPALIVE_SECONDS)
        self.poll = float(agentrun_settings.STREAM_POLL_SECONDS)
        self.cursor = cursor
        self.answered = dict(snapshot.answered) if snapshot is not None else {}
        self.streamed: set[tuple[int, int]] = set()  # (position, turn) whose deltas it sent
        self.once: set[str] = set()  # entries held back once for a read (see `live`)
        self.frontier = snapshot.frontier if snapshot is not None else 0
        self.last_output = self.loop.time()
        self.next_poll = 0.0
        self.need_db = False  # the entries ask for a read of the database first
        # The newest commit a nudge announced: until the events up to it are sent, the
        # deltas that came after the nudge wait (they belong to a later answer).
        self.nudged: reads.Cursor = cursor
        self.held: list[Any] = []  # the entries to send after that read
        self.ended = False

    def events(self, snapshot: reads.Snapshot) -> Iterator[str]:
        """The snapshot's durable events; the stream's end once its source rests and
        everything was sent (`ended`)."""
        self.frontier = snapshot.frontier
        # This app's own format frames an event the same for every stream: a snapshot
        # shared by the process's streams (stream_reads.read_on) is framed once.
        framed = snapshot.framed if type(self.fmt) is EventsFormat else None
        for n, (event, at) in enumerate(zip(snapshot.events, snapshot.cursors, strict=True)):
            self.cursor = at
            turn = reads.answered_by(event)
            if turn > self.answered.get(at[0], -1):
                self.answered[at[0]] = turn
            if framed is None:
                yield from self.fmt.event(event, self.source.cursor_text(at))
            else:
                found = framed.get(n)
                if found is None:
                    found = framed[n] = "".join(self.fmt.event(event, self.source.cursor_text(at)))
                yield found
            self.last_output = self.loop.time()
        if not snapshot.more:
            # Every commit nudged before this read is in it: nothing is awaited any more.
            self.nudged = self.cursor
        if snapshot.resting and self.cursor >= snapshot.last:
            yield from self.fmt.close(snapshot.state, self.source.cursor_text(self.cursor))
            self.ended = True
            return
        live = self.deltas is not None and not self.deltas.hub.down
        seldom = SAFETY_POLL_FACTOR if live else 1
        self.next_poll = self.loop.time() + (0 if snapshot.more else self.poll * seldom)

    def live(self, entries: list[Any]) -> Iterator[str]:
        """The deltas among `entries` (read from Redis) of answers not yet committed, of the
        runs the stream has reached. A commit's nudge past the cursor asks for a read of
        the database (`need_db`), and the deltas after it wait for that read (`held`): they
        follow the commit (the next turn's answer), so the client gets that commit's events
        first, as they happened. A later run's delta is held back once, for a read too."""
        self.need_db, self.held = False, []
        for entry_id, item in entries:
            position = item.get("position", 0)
            if item.get("kind") == "commit":
                at = (position, item.get("seq", 0))
                if at > self.cursor:
                    self.need_db = True
                    self.nudged = max(self.nudged, at)
                continue
            if item.get("kind") == "tool_progress":
                # A tool call's progress (an MCP server's notification): ephemeral, of a call
                # whose turn is committed; sent as it comes, to readers of the run it is in.
                if self.cursor[0] <= position <= self.frontier:
                    yield from self.fmt.delta(item)
                    self.last_output = self.loop.time()
                continue
            if self.nudged > self.cursor:
                self.held.append((entry_id, item))
                self.need_db = True
                continue
            turn = item.get("turn")
            answered = self.answered.get(position, -1)
            if not isinstance(turn, int) or turn <= answered:
                continue  # an answer already committed: its record was (or will be) sent
            if turn > answered + 1 and entry_id not in self.once:
                # A turn starts after the answer before it is committed: that answer's
                # events are not sent yet (the deltas were caught up from Redis after the
                # database was read). Read them first, then these (once: a run's history
                # may start past turn 0).
                self.once.add(entry_id)
                self.held.append((entry_id, item))
                self.need_db = True
                continue
            if position > self.frontier and entry_id not in self.once:
                # A later run writes: the run before it has ended since the last read. Read
                # its last events first, then these (once: a run cannot write out of turn).
                self.once.add(entry_id)
                self.held.append((entry_id, item))
                self.need_db = True
                continue
            if not self.cursor[0] <= position <= self.frontier:
                continue  # a run before the cursor's, or one whose events wait
            if item.get("kind") == "attempt":
                item = {**item, "restart": (position, turn) in self.streamed}
            self.streamed.add((position, turn))
            yield from self.fmt.delta(item)
            self.last_output = self.loop.time()

    async def wait(self, now: float, held: list[Any]) -> list[Any]:
        """Wait for the next entries until the next poll or keep-alive is due; the `held`
        ones when none came (no Redis, or Redis failing: the database is read meanwhile).
        Raises SlowReader (more waited for this client than it may hold) and Revoked (its
        user may no longer see it)."""
        wait = max(
            0.0, min(self.next_poll, self.last_output + self.keepalive, self.lease.ends_at) - now
        )
        if self.deltas is None:
            await self.inbox.wait(wait)
            for signal in self.inbox.drain():
                if isinstance(signal, Exception):
                    raise signal
            return held
        try:
            return await self.deltas.next(wait)
        except Gap:
            # The hub missed entries (Redis failed, or it is back): read the database now,
            # and every poll while Redis fails.
            self.need_db = True
            return held
