"""The turn engine: decides from the database, writes through services."""

from __future__ import annotations

from .loop import Outcome, advance

__all__ = ["Outcome", "advance"]
