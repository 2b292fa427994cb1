"""Which URLs a webhook may go to: `django_agentrun.outbound`, where the policy lives (MCP
servers over HTTP use it too, where the host opts in): http(s) only, public addresses only
(the IANA special-purpose registries; every IPv6 form of an IPv4 address judged by that
address) unless allowed in AGENTRUN_WEBHOOK_ALLOWED_HOSTS; the request pinned to an address
that was checked. Kept importable from here, where it was first defined."""

from __future__ import annotations

from ..outbound import UrlRefused, check, pinned, public, resolve

__all__ = ["UrlRefused", "check", "pinned", "public", "resolve"]
