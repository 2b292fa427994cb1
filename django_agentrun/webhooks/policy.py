"""Which URLs a webhook may go to: http(s) only, and no private, loopback, link-local,
reserved or multicast address unless its host name, address or network is allowed
(AGENTRUN_WEBHOOK_ALLOWED_HOSTS). The host is resolved and every address it resolves to
is checked; the request then goes to an address that was checked (`pinned`), never to what
the name resolves to a moment later. No database."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class UrlRefused(ValueError):
    """The URL is not one a webhook may go to."""


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


def public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def check(url: str, allowed: Iterable[str] = (), resolver: Resolver = resolve) -> list[str]:
    """The addresses `url`'s host resolves to, if a webhook may go there; else UrlRefused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused(f"Not an http(s) URL: {url!r}")
    host = parts.hostname.lower().rstrip(".")
    names = {entry.lower().rstrip(".") for entry in allowed}
    if host in names:
        return []
    networks = []
    for entry in names:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue  # a host name
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UrlRefused(f"Bad port in {url!r}") from exc
    try:
        addresses = resolver(host, port)
    except OSError as exc:
        raise UrlRefused(f"Cannot resolve {host!r}: {exc}") from exc
    if not addresses:
        raise UrlRefused(f"{host!r} resolves to no address")
    for text in addresses:
        address = ipaddress.ip_address(text.partition("%")[0])
        if public(address) or any(address in network for network in networks):
            continue
        raise UrlRefused(
            f"{host!r} resolves to {address}, a private, loopback, link-local or reserved "
            "address (allow it in AGENTRUN_WEBHOOK_ALLOWED_HOSTS)"
        )
    return addresses


def pinned(url: str, addresses: list[str]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """Where to send a request for `url` so that it reaches one of the `addresses` `check`
    found, not what the name resolves to when the client connects (a DNS rebinding: public
    when checked, private a moment later): the URL with the first address for its host,
    the Host header it had, and for https the TLS server name (the certificate is checked
    against the name). A host allowed by name (no addresses) is connected to by name."""
    if not addresses:
        return url, {}, {}
    parts = urlsplit(url)
    address = addresses[0].partition("%")[0]
    host = f"[{address}]" if ":" in address else address
    userinfo, at, hostport = parts.netloc.rpartition("@")
    port = f":{parts.port}" if parts.port else ""
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return (
        urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}{port}")),
        {"host": hostport},
        extensions,
    )
