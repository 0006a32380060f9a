"""Byte counts for people: one formatter, shared by the CLI and the TUI."""

from __future__ import annotations


def human_bytes(n: int | None) -> str:
    """Decimal units (1 GB = 10^9 B), as disk and download sizes are quoted."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"
