"""The HTTP side of an MCP server's session: its client (checked and pinned to a public
address when the server is `public_only`), and URLs kept out of logs and errors with
their query strings (where an API key often rides) replaced.

httpx2 logs each request at INFO with its whole URL; `hide_queries` is a filter on its
logger that writes those URLs without their query strings, for every client of the process
(the Messages API's URLs carry none).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx2

from ..outbound import UrlRefused, check, pinned
from .servers import MCPServer

# An http(s) URL's query string (up to the next blank or quote).
_QUERY = re.compile(r"(https?://[^\s'\"?#]+)\?[^\s'\"#]*", re.IGNORECASE)
HIDDEN = "?[hidden]"

# The timeouts the mcp SDK's own client factory sets (create_mcp_http_client).
CONNECT_SECONDS = 30.0
READ_SECONDS = 300.0


def without_queries(text: str) -> str:
    """`text` with the query string of each URL in it hidden."""
    return _QUERY.sub(lambda m: m.group(1) + HIDDEN, text)


class HideQueries(logging.Filter):
    """Writes the URLs of a log record's arguments without their query strings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any("?" in str(a) for a in record.args):
            record.args = tuple(
                without_queries(str(a)) if "?" in str(a) else a for a in record.args
            )
        return True


_FILTER = HideQueries()


def hide_queries() -> None:
    """Install the filter on httpx2's logger (once)."""
    for name in ("httpx2", "httpx"):
        log = logging.getLogger(name)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)


def client(server: MCPServer, headers: dict[str, str]) -> tuple[Any, str]:
    """An httpx2 AsyncClient for a session with `server`, and the URL to open it at. With
    `public_only`, the URL's host is resolved and checked now (UrlRefused) and every request
    of the session goes to a checked address under the URL's name (a DNS rebinding cannot
    send it inside), with no proxy from the environment."""
    url = server.url_now()
    timeout = httpx2.Timeout(CONNECT_SECONDS, read=READ_SECONDS)
    if not server.public_only:
        return httpx2.AsyncClient(headers=headers, timeout=timeout), url
    setting = f"MCPServer {server.name!r} allowed_hosts"
    addresses = check(url, server.allowed_hosts, setting=setting)
    target, _host, extensions = pinned(url, addresses)  # the Host header is the URL's own
    transport = _Pinned(url, target, extensions)
    return (
        httpx2.AsyncClient(
            headers=headers,
            timeout=timeout,
            transport=transport,
            trust_env=False,
            follow_redirects=False,
        ),
        url,
    )


class _Pinned(httpx2.AsyncBaseTransport):
    """A transport that sends the requests for the URL's host to the checked address."""

    def __init__(self, url: str, target: str, extensions: dict[str, Any]) -> None:
        self.inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.origin = httpx2.URL(url)
        self.target = httpx2.URL(target)
        self.extensions = extensions

    async def handle_async_request(self, request: Any) -> Any:
        url = request.url
        if (url.scheme, url.host, url.port) != (
            self.origin.scheme,
            self.origin.host,
            self.origin.port,
        ):
            raise UrlRefused(f"{url.host!r} is not the checked host of this MCP server")
        request.url = url.copy_with(host=self.target.host)
        request.extensions = {**request.extensions, **self.extensions}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
