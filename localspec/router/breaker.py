"""A circuit breaker for the remote tier: stop calling a server that keeps failing.

closed --(N consecutive failures)--> open --(cooldown elapsed)--> half-open
half-open --(the one trial call succeeds)--> closed;  half-open --(it fails)--> open again.

While open, calls are refused at once, so a dead server costs nothing and the pipeline falls
back to the best local tier without waiting for timeouts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(self, failure_threshold: int = 3, cooldown_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False

    @property
    def state(self) -> State:
        with self._lock:
            return self._current()

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def _current(self) -> State:
        if self._state == "open" and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = "half_open"
            self._trial_in_flight = False
        return self._state

    def allow(self) -> bool:
        """May a call go out now? In half-open exactly one trial call is let through."""
        with self._lock:
            state = self._current()
            if state == "closed":
                return True
            if state == "half_open" and not self._trial_in_flight:
                self._trial_in_flight = True
                return True
            return False

    def retry_in(self) -> float:
        """Seconds until an open breaker lets a trial through (0 when not open)."""
        with self._lock:
            if self._current() != "open":
                return 0.0
            return max(0.0, self.cooldown_s - (self._clock() - self._opened_at))

    def record_success(self) -> None:
        with self._lock:
            self._state = "closed"
            self._failures = 0
            self._trial_in_flight = False

    def record_failure(self) -> None:
        with self._lock:
            state = self._current()
            self._failures += 1
            if state == "half_open" or self._failures >= self.failure_threshold:
                self._state = "open"
                self._opened_at = self._clock()
                self._trial_in_flight = False
