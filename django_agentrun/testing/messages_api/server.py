"""The Messages API stand-in as an object tests hold: start, stop, observe."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .cache import PromptCache
from .handler import APIHTTPServer
from .ratelimit import AccountLimit
from .recorder import Recorder
from .refusals import RefusedAnswers
from .script import Script


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
        rate_limit: AccountLimit | None = None,
    ) -> None:
        self.script = script
        # The account's rate limit (429 with retry-after and anthropic-ratelimit-* headers).
        self.rate_limit = rate_limit
        # What the MCP connector's servers list now: name -> tools (mcp_connector.py).
        self.mcp_listings: dict[str, list[dict[str, Any]]] = {}
        self.api_key = api_key
        self.host = host
        self._port = port
        self.on_request = on_request
        self._recorder = Recorder()  # outlives each start/stop
        # What the API would hold in its prompt cache (cache.py); outlives each start/stop.
        self.prompt_cache = PromptCache()
        # What refused answers streamed: sent back, they are refused again (refusals.py).
        self.refused_answers = RefusedAnswers()
        self._httpd: APIHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> MessagesAPIServer:
        if self._httpd is not None:
            return self
        httpd = APIHTTPServer(
            (self.host, self._port), self, self._recorder, self.prompt_cache, self.refused_answers
        )
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
        httpd.stop()
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
        return self._recorder.requests

    @property
    def last_request(self) -> dict[str, Any]:
        return self._recorder.last_request

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the recorded requests."""
        return [r["body"] for r in self.requests]

    @property
    def disconnects(self) -> int:
        """Streamed responses whose client hung up before the stream finished."""
        return self._recorder.disconnects

    @property
    def script_errors(self) -> list[BaseException]:
        """Exceptions raised by the script (each was answered with a 400)."""
        return self._recorder.script_errors

    def steps(self) -> Counter[int]:
        """Step index (assistant messages in the request) -> number of /v1/messages requests."""
        return self._recorder.steps()

    def reset(self) -> None:
        """Forget recorded requests, disconnects and script errors (the script stays)."""
        self._recorder.reset()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
        """Poll `predicate` until true or `timeout` seconds pass; returns its last value."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return predicate()
            time.sleep(0.01)
        return True
