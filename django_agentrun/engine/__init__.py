"""The turn engine: decides from the database, writes through transitions (driver.py runs
one advance; see its docstring for the phases)."""

from __future__ import annotations

from .driver import Outcome, advance, settle_in_flight

__all__ = ["Outcome", "advance", "settle_in_flight"]
