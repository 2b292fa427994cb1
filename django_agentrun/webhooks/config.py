"""What is wrong with AGENTRUN_WEBHOOKS, if anything (the system check agentrun.E050)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from standardwebhooks import Webhook

from ..store.outbox import ALL_EVENTS


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
        try:
            Webhook(str(entry["secret"]))
        except Exception:  # noqa: BLE001 - the library's words for a bad secret
            found.append(f"{where}: the secret is not a Standard Webhooks secret (whsec_...).")
        unknown = sorted(set(entry["events"]) - {*ALL_EVENTS, "*"})
        if unknown:
            found.append(f"{where}: unknown events {unknown}; known: {', '.join(ALL_EVENTS)}.")
    return found
