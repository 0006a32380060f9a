"""Helpers for driving the chat app with Textual's pilot (tests, screenshots, scripts/bench_faces.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_for(pilot, predicate: Callable[[], object], timeout: float = 60.0, what: str = "") -> None:
    """Let the app run until `predicate()` is true; fail after `timeout` seconds (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    # Plain sleeps while waiting: the pilot's pause also waits for every widget to go idle and gives
    # up after its own 30 s, which a streaming reply on a loaded CI box can outlast.
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await asyncio.sleep(0.02)
    await pilot.pause()  # then the messages the new state queued are handled before the test looks
