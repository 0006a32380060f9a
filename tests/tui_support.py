"""Helpers for driving the chat app with Textual's pilot (tests, screenshots, scripts/bench_faces.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


async def wait_for(pilot, predicate: Callable[[], object], timeout: float = 60.0, what: str = "") -> None:
    """Let the app run until `predicate()` is true; fail after `timeout` seconds (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await pilot.pause(0.02)
