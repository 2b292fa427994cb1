"""The reaper's former module name, kept so that imports written for earlier releases
(`from django_agentrun.recovery import reap`) keep working; see reaper.py."""

from __future__ import annotations

from .reaper import KINDS, Finding, ReapReport, reap

__all__ = ["KINDS", "Finding", "ReapReport", "reap"]
