"""Which addresses a request the app makes for a host may reach: public ones only, as the
IANA special-purpose address registries define them, unless allowed by name, address or
network. Used for webhooks (webhooks/policy.py) and, where the host opts in, MCP servers
over HTTP (`MCPServer.http(..., public_only=True)`). No database, no Django.

An IPv6 address that embeds or routes to an IPv4 address is judged by that IPv4 address
too: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible
(`::a.b.c.d`), NAT64 (`64:ff9b::/96`; the local-use `64:ff9b:1::/48` is never public), 6to4
(`2002::/16`), Teredo (`2001::/32`: its server and its client) and ISATAP interface ids.
Both must be public: the IPv6 address by the IPv6 registry (and within global unicast,
`2000::/3`, or the NAT64 prefix), each IPv4 address it carries by the IPv4 registry.

The tables are the registries' "Globally Reachable" column as of 2025 (RFC 6890 and its
updates), written out here rather than read from `ipaddress.is_global`, whose answers
changed between Python releases. The most specific entry wins (192.0.0.9/32 within
192.0.0.0/24). Multicast is never a place a request goes.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

# (network, globally reachable): IANA IPv4 Special-Purpose Address Registry.
IPV4_SPECIAL: tuple[tuple[str, bool], ...] = (
    ("0.0.0.0/8", False),  # "this network"
    ("10.0.0.0/8", False),  # private use
    ("100.64.0.0/10", False),  # shared address space (carrier-grade NAT)
    ("127.0.0.0/8", False),  # loopback
    ("169.254.0.0/16", False),  # link local (cloud metadata: 169.254.169.254)
    ("172.16.0.0/12", False),  # private use
    ("192.0.0.0/24", False),  # IETF protocol assignments
    ("192.0.0.0/29", False),  # IPv4 service continuity prefix
    ("192.0.0.8/32", False),  # IPv4 dummy address
    ("192.0.0.9/32", True),  # port control protocol anycast
    ("192.0.0.10/32", True),  # traversal using relays around NAT anycast
    ("192.0.0.170/31", False),  # NAT64/DNS64 discovery
    ("192.0.2.0/24", False),  # documentation (TEST-NET-1)
    ("192.31.196.0/24", True),  # AS112-v4
    ("192.52.193.0/24", True),  # AMT
    ("192.88.99.0/24", False),  # deprecated 6to4 relay anycast
    ("192.168.0.0/16", False),  # private use
    ("192.175.48.0/24", True),  # direct delegation AS112 service
    ("198.18.0.0/15", False),  # benchmarking
    ("198.51.100.0/24", False),  # documentation (TEST-NET-2)
    ("203.0.113.0/24", False),  # documentation (TEST-NET-3)
    ("224.0.0.0/4", False),  # multicast (its own registry)
    ("240.0.0.0/4", False),  # reserved
    ("255.255.255.255/32", False),  # limited broadcast
)

# (network, globally reachable): IANA IPv6 Special-Purpose Address Registry, and the
# deprecated site-local prefix (RFC 3879). The prefixes that carry an IPv4 address are
# judged by it as well (EMBEDDING below).
IPV6_SPECIAL: tuple[tuple[str, bool], ...] = (
    ("::1/128", False),  # loopback
    ("::/128", False),  # unspecified
    ("::ffff:0:0/96", False),  # IPv4-mapped: the IPv4 address decides
    ("64:ff9b::/96", True),  # IPv4-IPv6 translation (NAT64): the IPv4 address decides too
    ("64:ff9b:1::/48", False),  # local-use IPv4/IPv6 translation
    ("100::/64", False),  # discard-only
    ("100:0:0:1::/64", False),  # dummy IPv6 prefix
    ("2001::/23", False),  # IETF protocol assignments
    ("2001::/32", True),  # Teredo: its server and client addresses decide too
    ("2001:1::1/128", True),  # port control protocol anycast
    ("2001:1::2/128", True),  # TURN anycast
    ("2001:1::3/128", True),  # DNS-SD service registration protocol anycast
    ("2001:2::/48", False),  # benchmarking
    ("2001:3::/32", True),  # AMT
    ("2001:4:112::/48", True),  # AS112-v6
    ("2001:10::/28", False),  # deprecated ORCHID
    ("2001:20::/28", True),  # ORCHIDv2
    ("2001:30::/28", True),  # drone remote ID protocol entity tags
    ("2001:db8::/32", False),  # documentation
    ("2002::/16", True),  # 6to4: the IPv4 address decides too
    ("2620:4f:8000::/48", True),  # direct delegation AS112 service
    ("3fff::/20", False),  # documentation
    ("5f00::/16", False),  # segment routing SIDs
    ("fc00::/7", False),  # unique local
    ("fe80::/10", False),  # link local
    ("fec0::/10", False),  # site local (deprecated)
    ("ff00::/8", False),  # multicast
)

_V4 = sorted(
    ((ipaddress.IPv4Network(n), ok) for n, ok in IPV4_SPECIAL), key=lambda e: -e[0].prefixlen
)
_V6 = sorted(
    ((ipaddress.IPv6Network(n), ok) for n, ok in IPV6_SPECIAL), key=lambda e: -e[0].prefixlen
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT, RFC 2765
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible


def _registered(address: Address) -> bool | None:
    """The registry's answer for `address` (its most specific entry), None if unlisted."""
    table = _V4 if address.version == 4 else _V6
    for network, reachable in table:
        if address in network:
            return reachable
    return None


def embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries or routes to (none for an IPv4 one)."""
    if address.version == 4:
        return []
    assert isinstance(address, ipaddress.IPv6Address)
    value = int(address)
    interface = value & 0xFFFFFFFFFFFFFFFF
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in _TRANSLATED or address in _NAT64 or address in _COMPATIBLE:
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    # ISATAP: an interface id of 0000:5efe or 0200:5efe, then the IPv4 address.
    if (interface >> 32) & 0xFDFFFFFF == 0x5EFE:
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    return []


def public(address: Address) -> bool:
    """Whether a request may go to `address`: globally reachable by the special-purpose
    registries, and so is every IPv4 address it embeds or routes to."""
    for inner in embedded(address):
        if not public(inner):
            return False
    if address.version == 6 and (address.ipv4_mapped is not None or address in _TRANSLATED):
        return True  # an IPv4 address, written in IPv6: it decided above
    found = _registered(address)
    if found is not None:
        return found
    if address.version == 6:
        return address in _GLOBAL_UNICAST
    return True


def allowed(address: Address, networks: Iterable[Network]) -> bool:
    """Whether `address` (or the IPv4 address it embeds) is in one of `networks`."""
    candidates = [address, *embedded(address)]
    return any(a in n for a in candidates for n in networks if a.version == n.version)


def parse(text: str) -> Address:
    """An address as a resolver gives it (an IPv6 scope, `%eth0`, left out)."""
    return ipaddress.ip_address(text.partition("%")[0])


# --------------------------------------------------------------------------- URLs


class UrlRefused(ValueError):
    """The URL is not one a request of the app may go to."""


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


def check(
    url: str,
    allowed_hosts: Iterable[str] = (),
    resolver: Resolver = resolve,
    setting: str = "AGENTRUN_WEBHOOK_ALLOWED_HOSTS",
) -> list[str]:
    """The addresses `url`'s host resolves to, if a request may go there; else UrlRefused
    (naming the `setting` that allows a host)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused(f"Not an http(s) URL: {url!r}")
    host = parts.hostname.lower().rstrip(".")
    names = {entry.lower().rstrip(".") for entry in allowed_hosts}
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
        address = parse(text)
        if public(address) or allowed(address, networks):
            continue
        raise UrlRefused(
            f"{host!r} resolves to {address}, which is not a public address (private, "
            f"loopback, link-local, reserved, or an IPv6 form of one): allow it in {setting}"
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
