"""What is wrong with AGENTRUN_WEBHOOKS, if anything (the system check agentrun.E050), and
which of its subscriptions go to an address a delivery will refuse (agentrun.W050)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from .. import outbound
from ..store.outbox import ALL_EVENTS
from .signing import secret_problem


def problems(entries: Any) -> list[str]:
    """One sentence per mistake in the subscriptions from settings."""
    if not isinstance(entries, list | tuple):
        return [
            f"AGENTRUN_WEBHOOKS must be a list of subscriptions (got {type(entries).__name__})."
        ]
    found, names = [], set()
    for i, entry in enumerate(entries):
        where = f"AGENTRUN_WEBHOOKS[{i}]"
        if not isinstance(entry, dict):
            found.append(f"{where} must be a dict with name, url, secret and events.")
            continue
        missing = [k for k in ("name", "url", "secret", "events") if not entry.get(k)]
        if missing:
            found.append(f"{where} lacks {', '.join(missing)}.")
            continue
        if entry["name"] in names:
            found.append(f"{where}: the name {entry['name']!r} is used twice.")
        names.add(entry["name"])
        if urlsplit(str(entry["url"])).scheme not in ("http", "https"):
            found.append(f"{where}: the url must be http(s) (got {entry['url']!r}).")
        problem = secret_problem(entry["secret"])
        if problem is not None:
            found.append(f"{where}: {problem}.")
        unknown = sorted(set(entry["events"]) - {*ALL_EVENTS, "*"})
        if unknown:
            found.append(f"{where}: unknown events {unknown}; known: {', '.join(ALL_EVENTS)}.")
    return found


def refused_urls(entries: Any, allowed_hosts: Iterable[str]) -> list[str]:
    """One sentence per subscription from settings whose URL names a host that a delivery
    will refuse without AGENTRUN_WEBHOOK_ALLOWED_HOSTS: a private, loopback or reserved
    address, or `localhost`. Other names are resolved only when a delivery is sent."""
    if not isinstance(entries, list | tuple):
        return []
    names = {str(e).lower().rstrip(".") for e in allowed_hosts}
    networks = []
    for entry in names:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue
    found = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        try:
            host = (urlsplit(str(entry.get("url", ""))).hostname or "").rstrip(".")
        except ValueError:
            continue
        if not host or host in names:
            continue
        try:
            address = outbound.parse(host)
        except ValueError:
            private = host == "localhost" or host.endswith(".localhost")
        else:
            private = not outbound.public(address) and not outbound.allowed(address, networks)
        if private:
            found.append(
                f"AGENTRUN_WEBHOOKS[{i}] ({entry.get('name')!r}) goes to {host}, which is not a "
                "public address: every delivery to it will be refused."
            )
    return found
