"""System checks (filled in below)."""
