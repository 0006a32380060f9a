"""What travels on a request through the pipeline: the job a face reads, and what was decided.

A job's events come from whichever thread produces them (the engine's, a remote tier's, the
completion thread) and reach the face without a relay: a thread-side reader iterates the job,
an asyncio face awaits `subscribe()`'s queue, fed by `loop.call_soon_threadsafe`. Nothing polls.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from localspec.cache import CacheScope
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Event
from localspec.router import RouteDecision, TierName


class CacheStatus(StrEnum):
    HIT = "hit"
    MISS = "miss"
    BYPASS = "bypass"


@dataclass(frozen=True)
class CacheInfo:
    status: CacheStatus
    kind: str | None = None  # "exact" | "semantic" on a hit
    similarity: float | None = None
    matched_prompt: str | None = None
    entry_id: str | None = None
    judge: float | None = None  # the reuse judge's score on a judged semantic hit
    reason: str | None = None  # why the cache was bypassed
    remembered: bool | None = None  # True: a judged hit whose verdict for this prompt was remembered
    judged_by: str | None = None  # the judge that confirmed a semantic hit (model file or pair scorer)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class CacheKey:
    scope: CacheScope
    prompt: str


@dataclass
class Route:
    """Which tier answers and why; the cascade and the remote fallback fill in what happened."""

    tier: TierName
    reason: str
    decision: RouteDecision | None = None  # None: the request named its tier
    escalated: bool | None = None
    escalation_reason: str | None = None
    mean_logprob: float | None = None  # the small tier's, which the escalation rule read
    fallback: str | None = None  # why the remote tier's request went to a local one

    @property
    def policy(self) -> str:
        return self.decision.policy if self.decision is not None else "explicit"

    def as_dict(self) -> dict[str, Any]:
        """The response's `localspec.route` object (its keys are part of the API)."""
        out: dict[str, Any] = (self.decision.as_dict() if self.decision
                               else {"policy": "explicit", "reason": self.reason})
        out["tier"] = str(self.tier)
        if self.escalated is not None:  # the cascade ran: its mean logprob is reported even when unknown
            out.update(escalated=self.escalated, escalation_reason=self.escalation_reason,
                       mean_logprob=self.mean_logprob)
        if self.fallback is not None:
            out["fallback"] = self.fallback
        return out


class Job:
    """One request as a face sees it: its events (Tokens, then one Done), what the pipeline decided
    (`cache`, `route`, `tier`) and `cancel()`."""

    def __init__(self, request: GenerationRequest, tier: TierName, route: Route | None = None) -> None:
        self.id = uuid.uuid4().hex  # the response's id and the metrics record's
        self.t_submit = time.perf_counter()
        self.request = request
        self.tier = tier
        self.route = route
        self.cache: CacheInfo | None = None
        self.result: Done | None = None
        self.done = threading.Event()
        self.dropped_messages = 0
        self._log: list[Event] = []
        self._readers: list[Callable[[Event], None]] = []
        self._changed = threading.Condition()
        self._cancel = threading.Event()
        self._stop_current: Callable[[], None] | None = None  # cancels whatever answers now

    # the face's side

    def __iter__(self) -> Iterator[Event]:
        """The events, blocking between them: for a face that reads on a thread of its own."""
        seen = 0
        while True:
            with self._changed:
                while len(self._log) <= seen:
                    self._changed.wait()
                event = self._log[seen]
            seen += 1
            yield event
            if isinstance(event, Done):
                return

    def subscribe(self) -> asyncio.Queue[Event]:
        """The events so far, then each as it comes, in a queue of the running event loop."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def feed(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        with self._changed:
            for event in self._log:
                events.put_nowait(event)
            self._readers.append(feed)
        return events

    def cancel(self) -> None:
        with self._changed:
            self._cancel.set()
            stop = self._stop_current
        if stop is not None:
            stop()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        return self._cancel

    @property
    def cached(self) -> bool:
        return self.cache is not None and self.cache.status is CacheStatus.HIT

    # the pipeline's side

    def attach(self, stop: Callable[[], None], *, dropped_messages: int = 0) -> None:
        """What answers now (its cancel); a cancel that came first reaches it at once."""
        with self._changed:
            self._stop_current = stop
            self.dropped_messages = dropped_messages
            cancelled = self._cancel.is_set()
        if cancelled:
            stop()

    def emit(self, event: Event) -> None:
        # Under the lock: a reader that subscribes meanwhile sees every event once, in order.
        with self._changed:
            self._log.append(event)
            readers = list(self._readers)
            for read in readers:
                try:
                    read(event)
                except RuntimeError:  # that reader's loop has closed: nobody is listening there
                    self._readers.remove(read)
            self._changed.notify_all()

    def finish(self, done: Done) -> None:
        self.result = done
        self.emit(done)
        self.done.set()
