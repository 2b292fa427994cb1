"""The HTTP side of the Messages API stand-in: the threaded HTTP server and its request
handler (validation, the script's answer, JSON or a stream of Server-Sent Events)."""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from . import mcp_connector, model_list, options, replies, servertools
from .cache import PromptCache, tokens
from .loops import ThinkingLoops
from .recorder import Recorder
from .refusals import RefusedAnswers, continued_refusal
from .script import Reply, Script, ScriptExhausted, as_reply, new_id
from .validation import APIRequestError, invalid, validate_request


class Served(Protocol):
    """What the handler reads of the API it serves (server.MessagesAPIServer), each time a
    request comes in: a test may change any of them while the server runs."""

    script: Script | None
    api_key: str | None
    on_request: Callable[[dict[str, Any]], None] | None


class _ClientGone(Exception):
    """The client closed the connection."""


class APIHTTPServer(ThreadingHTTPServer):
    """Serves `api` (its script, key and on_request hook), recording into `recorder`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        api: Served,
        recorder: Recorder,
        cache: PromptCache | None = None,
        refused: RefusedAnswers | None = None,
    ) -> None:
        super().__init__(address, Handler)
        self.api = api
        self.recorder = recorder
        self.cache = cache if cache is not None else PromptCache()
        self.refused = refused if refused is not None else RefusedAnswers()
        self.loops = ThinkingLoops()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()

    def track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def stop(self) -> None:
        """Stop serving, close the socket, and end the open connections."""
        self.stopping.set()
        self.shutdown()
        self.server_close()
        # Wake handler threads parked on idle keep-alive connections or slow streams.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (aborted streams, closed pools) are normal here: stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _ClientGone) or self.stopping.is_set():
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like the real API
    server_version = "fake-anthropic"
    timeout = 60  # an idle keep-alive connection's thread ends after this
    server: APIHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: tests and benchmarks print their own story

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.track(self.connection, add=False)

    # -- plumbing ---------------------------------------------------------------------------

    def _record(self, body: Any) -> dict[str, Any]:
        return self.server.recorder.record(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            request_id=self._request_id,
        )

    def _answered(self, record: dict[str, Any]) -> None:
        on_request = self.server.api.on_request
        if on_request is not None:
            on_request(dict(record))

    def _send_json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", self._request_id)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, exc: APIRequestError, headers: dict[str, str] | None = None) -> None:
        self._rec["status"] = exc.status
        self._rec["error"] = f"{exc.error_type}: {exc.message}"
        error: dict[str, Any] = {"type": exc.error_type, "message": exc.message}
        if exc.details:
            error["details"] = exc.details
        self._send_json(
            exc.status, {"type": "error", "error": error, "request_id": self._request_id}, headers
        )

    def _client_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True as soon as the client hangs up."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                readable, _, _ = select.select(
                    [self.connection], [], [], max(0.0, min(remaining, 0.05))
                )
                if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    return True
            except OSError:
                return True
            if self.server.stopping.is_set():
                return True
            if remaining <= 0:
                return False
            if readable:
                # Unexpected bytes from the client (not a hang-up): just wait out the time.
                time.sleep(max(0.0, min(remaining, 0.05)))

    def _write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as exc:
            raise _ClientGone() from exc

    # -- requests ---------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._request_id = new_id("req_")
        self._rec = self._record(None)
        path, _, query = self.path.partition("?")
        try:
            if path == "/v1/models" or path.startswith("/v1/models/"):
                # The Models API, from the shipped model table.
                self._check_headers()
                model_id = path[len("/v1/models/") :] if path != "/v1/models" else ""
                try:
                    payload = model_list.retrieve(model_id) if model_id else model_list.page(query)
                except model_list.NotFound as exc:
                    raise APIRequestError(404, str(exc), "not_found_error") from None
                except model_list.Invalid as exc:
                    raise invalid(str(exc)) from None
                self._rec["status"] = 200
                self._send_json(200, payload)
            else:
                self._send_error(APIRequestError(404, f"Not found: {self.path}"))
        except APIRequestError as exc:
            self._send_error(exc)
        finally:
            self._answered(self._rec)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        # One handler serves every request of a keep-alive connection: forget the last one.
        self._rec: dict[str, Any] | None = None
        try:
            self._post()
        finally:
            if self._rec is not None:
                self._answered(self._rec)

    def _post(self) -> None:
        api, recorder = self.server.api, self.server.recorder
        self._request_id = new_id("req_")
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            self._rec = self._record(None)
            self._send_error(invalid("There was an error parsing the body: invalid JSON"))
            return
        self._rec = self._record(body)
        path = self.path.split("?", 1)[0]
        if path != "/v1/messages":
            self._send_error(APIRequestError(404, f"Not found: {self.path}"))
            return
        try:
            self._check_headers()
            validate_request(body, self._betas())
            problem = self.server.loops.problem(body)
            if problem:
                raise invalid(problem)
        except APIRequestError as exc:
            self._send_error(exc)
            return
        limit = getattr(api, "rate_limit", None)
        limited: dict[str, str] = {}
        if limit is not None:  # the account's limit (ratelimit.py), after the request is read
            allowed, limited = limit.take()
            if not allowed:
                message = "This request would exceed your organization's rate limit."
                self._send_error(APIRequestError(429, message, "rate_limit_error"), limited)
                return
        try:
            if body["max_tokens"] == 0:
                # max_tokens 0 fills the prompt cache and writes nothing (SDK's
                # MessageCreateParams.max_tokens; prompt-caching "Pre-warming the cache"):
                # the script is not asked. The empty answer's shape is UNSOURCED.
                reply = Reply(content=[], stop_reason="max_tokens", usage={"output_tokens": 0})
            elif self.server.refused.sent_again(body):
                reply = continued_refusal()  # the script is not asked (refusals.py)
            else:
                reply = as_reply(api.script, body) if api.script is not None else None
            if reply is None:
                raise ScriptExhausted("fake API has no script")
            _check_format(body, reply)
            reply = mcp_connector.answered(body, reply, getattr(api, "mcp_listings", None))
        except Exception as exc:  # noqa: BLE001 - a broken script is reported to the client
            recorder.script_error(exc)
            self._send_error(invalid(f"{type(exc).__name__}: {exc}"))
            return
        stream = bool(body.get("stream"))
        if reply.latency and self._client_gone(reply.latency):
            if stream:
                recorder.disconnected()
            self.close_connection = True
            return
        if reply.is_error:
            self._send_error(
                APIRequestError(
                    reply.status, reply.error_message or "", reply.error_type, reply.error_details
                ),
                reply.headers,
            )
            return
        reply = _compacted(body, reply)
        self.server.refused.remember(reply)
        self.server.loops.remember(reply)
        if limited:
            reply = replace(reply, headers={**limited, **reply.headers})
        # Read and written by the prompt cache when the API reads the prompt: once answered.
        prompt = self.server.cache.account(body)
        if stream:
            self._stream(body, reply, prompt)
        else:
            self._rec["status"] = 200
            self._send_json(
                200, replies.message(body, reply, reply.blocks(), prompt), reply.headers
            )

    def _betas(self) -> set[str]:
        header = self.headers.get("anthropic-beta") or ""
        return {part.strip() for part in header.split(",") if part.strip()}

    def _check_headers(self) -> None:
        api = self.server.api
        key = self.headers.get("x-api-key")
        auth = self.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            key = key or auth[7:].strip()
        if not key:
            raise APIRequestError(401, "x-api-key header is required")
        if api.api_key is not None and key != api.api_key:
            raise APIRequestError(401, "invalid x-api-key")
        if not self.headers.get("anthropic-version"):
            raise invalid("anthropic-version: header is required")

    def _stream(self, body: dict[str, Any], reply: Reply, prompt: dict[str, Any]) -> None:
        self._rec["status"] = 200
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", self._request_id)
        for key, value in reply.headers.items():
            self.send_header(key, value)
        try:
            self.end_headers()
            for n, event in enumerate(replies.events(body, reply, self._request_id, prompt)):
                if reply.drop_after is not None and n >= reply.drop_after:
                    # Simulate a network failure: cut the connection without ending the body.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.end_after is not None and n >= reply.end_after:
                    break  # a clean end of the body, before the message is complete
                if n and reply.delay and self._client_gone(reply.delay):
                    raise _ClientGone()
                if reply.hold is not None and n == reply.hold_at:
                    while not reply.hold.is_set():
                        if self._client_gone(0.05):
                            raise _ClientGone()
                self._write_chunk(event)
            self._write_chunk(b"")  # the terminating zero-length chunk
        except (_ClientGone, OSError):
            self.close_connection = True
            if not self.server.stopping.is_set():
                self.server.recorder.disconnected()


def _compacted(body: dict[str, Any], reply: Reply) -> Reply:
    """The reply as the API answers a request whose compaction is due: a compaction block
    first (then the answer, or nothing more with pause_after_compaction: stop reason
    `compaction`)."""
    if not servertools.should_compact(body, tokens):
        return reply
    count = len(body.get("messages") or [])
    block = servertools.compaction_block(f"Summary of the conversation so far ({count} messages).")
    edit = servertools.compact_edit(body) or {}
    if edit.get("pause_after_compaction"):
        return replace(reply, content=[block], stop_reason="compaction", truncate_input=False)
    return replace(reply, content=[block, *reply.content])


class ScriptBreaksFormat(ValueError):
    """A scripted answer does not follow the request's output_config.format schema."""


def _check_format(body: dict[str, Any], reply: Reply) -> None:
    """The real model's complete answer follows the requested schema (constrained
    decoding); only one cut short (max_tokens) or refused may not."""
    fmt = (body.get("output_config") or {}).get("format")
    if not fmt or reply.is_error or reply.stop_reason not in ("end_turn", "stop_sequence"):
        return
    answer = "".join(str(b.get("text", "")) for b in reply.blocks() if b.get("type") == "text")
    try:
        value = json.loads(answer)
    except ValueError:
        raise ScriptBreaksFormat(f"the scripted answer is not JSON: {answer[:80]!r}") from None
    problem = options.mismatch(value, fmt["schema"], fmt["schema"])
    if problem:
        raise ScriptBreaksFormat(f"the scripted answer breaks the requested schema: {problem}")
