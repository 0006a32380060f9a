"""The remote tier's circuit breaker, driven by an injected clock."""

from __future__ import annotations

import pytest

from localspec.router import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_then_half_opens_and_closes():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, cooldown_s=30, clock=clock)
    assert b.state == "closed" and b.allow()
    b.record_failure()
    b.record_failure()
    assert b.state == "closed" and b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow()
    assert b.retry_in() == pytest.approx(30)
    clock.now += 29.9
    assert b.state == "open" and not b.allow()
    clock.now += 0.1
    assert b.state == "half_open"
    assert b.allow()  # the one trial call
    assert not b.allow()  # others wait while it is in flight
    b.record_success()
    assert b.state == "closed" and b.consecutive_failures == 0 and b.allow()


def test_a_success_resets_the_failure_count():
    b = CircuitBreaker(failure_threshold=2, clock=Clock())
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state == "closed"
    b.record_failure()
    assert b.state == "open"


def test_failed_trial_reopens_for_a_full_cooldown():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, cooldown_s=10, clock=clock)
    b.record_failure()
    assert b.state == "open"
    clock.now += 10
    assert b.allow() and b.state == "half_open"
    b.record_failure()
    assert b.state == "open" and not b.allow()
    clock.now += 9
    assert b.state == "open"
    clock.now += 1
    assert b.allow()


def test_threshold_must_be_positive():
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
