"""The HTTP server of the Messages API stand-in: JSON and Server-Sent Events."""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .script import Reply, Script, ScriptExhausted, as_reply, last_tool_use_index, new_id, step_of
from .validation import APIRequestError, invalid, validate_request


def _chunks(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[k : k + size] for k in range(0, len(s), size)]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _ClientGone(Exception):
    """The client closed the connection."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: MessagesAPIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (aborted streams, closed pools) are normal here: stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _ClientGone) or self.api._stopping.is_set():
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, like the real API
    server_version = "fake-anthropic"
    timeout = 60  # an idle keep-alive connection's thread ends after this
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: tests and benchmarks print their own story

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.api._track(self.connection, add=False)

    # -- plumbing ---------------------------------------------------------------------------

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
        self._send_json(
            exc.status,
            {
                "type": "error",
                "error": {"type": exc.error_type, "message": exc.message},
                "request_id": self._request_id,
            },
            headers,
        )

    def _client_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True as soon as the client hangs up."""
        deadline = time.monotonic() + timeout
        api = self.server.api
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
            if api._stopping.is_set():
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
        self._rec = self.server.api._record(self, None)
        try:
            self._send_error(APIRequestError(404, f"Not found: {self.path}"))
        finally:
            self.server.api._answered(self._rec)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        # One handler serves every request of a keep-alive connection: forget the last one.
        self._rec: dict[str, Any] | None = None
        try:
            self._post()
        finally:
            if self._rec is not None:
                self.server.api._answered(self._rec)

    def _post(self) -> None:
        api = self.server.api
        self._request_id = new_id("req_")
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            self._rec = api._record(self, None)
            self._send_error(invalid("There was an error parsing the body: invalid JSON"))
            return
        self._rec = api._record(self, body)
        path = self.path.split("?", 1)[0]
        if path != "/v1/messages":
            self._send_error(APIRequestError(404, f"Not found: {self.path}"))
            return
        try:
            self._check_headers()
            validate_request(body)
        except APIRequestError as exc:
            self._send_error(exc)
            return
        try:
            reply = as_reply(api.script, body) if api.script is not None else None
            if reply is None:
                raise ScriptExhausted("fake API has no script")
        except Exception as exc:  # noqa: BLE001 - a broken script is reported to the client
            api._script_error(exc)
            self._send_error(invalid(f"{type(exc).__name__}: {exc}"))
            return
        stream = bool(body.get("stream"))
        if reply.latency and self._client_gone(reply.latency):
            if stream:
                api._disconnected()
            self.close_connection = True
            return
        if reply.is_error:
            self._send_error(
                APIRequestError(reply.status, reply.error_message or "", reply.error_type),
                reply.headers,
            )
        elif stream:
            self._stream(body, reply)
        else:
            self._rec["status"] = 200
            self._send_json(200, self._message(body, reply, reply.blocks()), reply.headers)

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

    def _usage(self, body: dict[str, Any], reply: Reply, content: list[dict[str, Any]]) -> dict:
        usage = {
            "input_tokens": max(1, len(json.dumps(body)) // 4),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": max(1, len(json.dumps(content)) // 4),
        }
        usage.update(reply.usage or {})
        return usage

    def _message(
        self, body: dict[str, Any], reply: Reply, content: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "id": reply.message_id or new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": reply.model or body["model"],
            "content": content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": reply.stop_sequence,
            "usage": {**self._usage(body, reply, content), "service_tier": "standard"},
        }

    def _events(self, body: dict[str, Any], reply: Reply) -> Iterator[bytes]:
        """The SSE events of a streamed reply, in the real API's order and shape."""
        content = [dict(b) for b in reply.content]  # type: ignore[union-attr]
        cut = last_tool_use_index(content) if reply.truncate_input else None
        if cut is not None:
            content = content[: cut + 1]
        message = self._message(body, reply, [])
        message["stop_reason"] = message["stop_sequence"] = None  # only known at the end
        usage = self._usage(body, reply, content)
        message["usage"] = {**usage, "output_tokens": 1, "service_tier": "standard"}
        yield _sse("message_start", {"type": "message_start", "message": message})
        yield _sse("ping", {"type": "ping"})
        for index, block in enumerate(content):
            kind = block.get("type")
            if kind == "text":
                start: dict[str, Any] = {**block, "text": ""}
                deltas = [
                    {"type": "text_delta", "text": c}
                    for c in _chunks(block["text"], reply.chunk_size)
                ]
            elif kind in ("tool_use", "server_tool_use"):
                start = {**block, "input": {}}
                payload = json.dumps(block.get("input") or {})
                if index == cut:
                    payload = payload[: len(payload) // 2] if len(payload) > 2 else ""
                # The real API opens every tool input with an empty partial_json.
                deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                    {"type": "input_json_delta", "partial_json": c}
                    for c in _chunks(payload, reply.chunk_size)
                ]
            elif kind == "thinking":
                start = {**block, "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": c}
                    for c in _chunks(block.get("thinking", ""), reply.chunk_size)
                ] + [{"type": "signature_delta", "signature": block.get("signature", "")}]
            else:
                start, deltas = block, []
            yield _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            for delta in deltas:
                yield _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        if reply.stream_error:
            yield _sse(
                "error",
                {
                    "type": "error",
                    "error": {"type": reply.stream_error, "message": f"fake {reply.stream_error}"},
                    "request_id": self._request_id,
                },
            )
            return
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        api = self.server.api
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
            for n, event in enumerate(self._events(body, reply)):
                if reply.drop_after is not None and n >= reply.drop_after:
                    # Simulate a network failure: cut the connection without ending the body.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.end_after is not None and n >= reply.end_after:
                    break  # a clean end of the body, before the message is complete
                if n and reply.delay and self._client_gone(reply.delay):
                    raise _ClientGone()
                self._write_chunk(event)
            self._write_chunk(b"")  # the terminating zero-length chunk
        except (_ClientGone, OSError):
            self.close_connection = True
            if not api._stopping.is_set():
                api._disconnected()


class MessagesAPIServer:
    """A fake Messages API on 127.0.0.1 (a random port by default) in a daemon thread.

    Use as a context manager or call start()/stop(). `script(body) -> Reply` picks
    the answer to each valid request; change it any time via `.script = ...`.
    `api_key`, if given, is the only key accepted (any key is, by default).
    `on_request(record)`, if given, is called in the handler's thread once each
    request is answered (the record as in `requests`; `error` holds the refusal).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.script = script
        self.api_key = api_key
        self.host = host
        self._port = port
        self.on_request = on_request
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._disconnects = 0
        self._script_errors: list[BaseException] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> MessagesAPIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer((self.host, self._port), _Handler)
        httpd.api = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
            name="fake-anthropic",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        # Wake handler threads parked on idle keep-alive connections or slow streams.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MessagesAPIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("MessagesAPIServer is not started")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """E.g. "http://127.0.0.1:PORT" (what ANTHROPIC_BASE_URL / base_url= take)."""
        host = self._httpd.server_address[0] if self._httpd is not None else self.host
        if host in ("0.0.0.0", ""):  # listening everywhere: this machine answers on loopback
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    # -- observations ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Recorded requests (a copy): path, method, headers (lower-case), body, time, step,
        status, error (the refusal, or None), stream."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> dict[str, Any]:
        with self._lock:
            if not self._requests:
                raise LookupError("no request recorded")
            return self._requests[-1]

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the recorded requests."""
        return [r["body"] for r in self.requests]

    @property
    def disconnects(self) -> int:
        """Streamed responses whose client hung up before the stream finished."""
        with self._lock:
            return self._disconnects

    @property
    def script_errors(self) -> list[BaseException]:
        """Exceptions raised by the script (each was answered with a 400)."""
        with self._lock:
            return list(self._script_errors)

    def steps(self) -> Counter[int]:
        """Step index (assistant messages in the request) -> number of /v1/messages requests."""
        with self._lock:
            return Counter(
                r["step"] for r in self._requests if r["path"].startswith("/v1/messages")
            )

    def reset(self) -> None:
        """Forget recorded requests, disconnects and script errors (the script stays)."""
        with self._lock:
            self._requests.clear()
            self._disconnects = 0
            self._script_errors.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
        """Poll `predicate` until true or `timeout` seconds pass; returns its last value."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return predicate()
            time.sleep(0.01)
        return True

    # -- handler hooks --------------------------------------------------------------------------

    def _record(self, handler: _Handler, body: Any) -> dict[str, Any]:
        record = {
            "method": handler.command,
            "path": handler.path,
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "body": body,
            "time": time.time(),
            "step": step_of(body) if isinstance(body, dict) else 0,
            "stream": bool(body.get("stream")) if isinstance(body, dict) else False,
            "status": None,
            "error": None,
            "request_id": handler._request_id,
        }
        with self._lock:
            self._requests.append(record)
        return record

    def _answered(self, record: dict[str, Any]) -> None:
        if self.on_request is not None:
            self.on_request(dict(record))

    def _disconnected(self) -> None:
        with self._lock:
            self._disconnects += 1

    def _script_error(self, exc: BaseException) -> None:
        with self._lock:
            self._script_errors.append(exc)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
