"""What the metrics pane shows, from the same records the endpoint logs.

Each finished reply becomes one `localspec.metrics.RequestRecord` (face="tui"). It goes to the
shared metrics log (when one is attached; not when a server on this machine answered it, as that
server logs it already) and into this session's window, which feeds the pane's sparklines and
counters; there is no second way of counting.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace

from localspec.engine.events import Stats
from localspec.metrics import Metrics, RequestRecord

logger = logging.getLogger(__name__)

HISTORY = 40  # points kept for the sparklines
DRIFT_EVERY_S = 30.0  # drift reads the whole log window; no need to ask on every reply


@dataclass
class SessionSnapshot:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0
    route_decisions: int = 0
    errors: int = 0
    # Replies asked with a prediction (Predicted Outputs), and their prediction tokens kept and rejected.
    prediction_replies: int = 0
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    tokens_per_second: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    last_ttft_ms: float | None = None
    last_context_tokens: int = 0
    drift: list[str] = field(default_factory=list)


class SessionMetrics:
    def __init__(self, sink: Metrics | None = None, clock=time.monotonic) -> None:
        self.sink = sink
        self._records: deque[RequestRecord] = deque()
        self._snap = SessionSnapshot()
        self._tps: deque[float] = deque(maxlen=HISTORY)
        self._acc: deque[float] = deque(maxlen=HISTORY)
        self._clock = clock
        self._drift: list[str] = []
        self._drift_at: float | None = None

    def record(self, stats: Stats, finish_reason: str, *, cached: bool | None = None, route: str | None = None,
               profile: str | None = None, target: str | None = None, draft: str | None = None,
               e2e_ms: float | None = None, log: bool = True) -> RequestRecord:
        """The reply in this session's window, and in the shared log unless `log` is False (a server
        on this machine answered it, and logs it itself)."""
        rec = RequestRecord.from_stats(
            stats, face="tui", profile=profile, target_model=target, draft_model=draft if stats.drafted else None,
            finish_reason=finish_reason, e2e_ms=e2e_ms, route=route,
            cache=None if cached is None else ("hit" if cached else "miss"),
        )
        self._add(rec)
        if self.sink is not None and log:
            try:
                self.sink.record(rec)
            except Exception:  # the pane keeps working if the log cannot be written
                logger.exception("recording to the metrics log failed")
        return rec

    def _add(self, rec: RequestRecord) -> None:
        s = self._snap
        s.requests += 1
        s.prompt_tokens += rec.prompt_tokens
        s.completion_tokens += rec.completion_tokens
        s.cache_hits += rec.cache == "hit"
        s.route_decisions += rec.route is not None
        s.errors += rec.finish_reason == "error"
        if rec.prediction_tokens or rec.prediction_drafted:
            s.prediction_replies += 1
            s.prediction_accepted += rec.prediction_accepted
            s.prediction_rejected += rec.prediction_rejected
        if rec.completion_tokens > 1:
            self._tps.append(rec.decode_tps)
        if rec.drafted:
            self._acc.append(rec.acceptance_rate)
        if rec.completion_tokens:
            s.last_ttft_ms = rec.ttft_ms
        s.last_context_tokens = rec.prompt_tokens + rec.completion_tokens

    def drift_flags(self) -> list[str]:
        """Active drift flags from the shared log, refreshed at most every DRIFT_EVERY_S."""
        if self.sink is None:
            return []
        now = self._clock()
        if self._drift_at is None or now - self._drift_at >= DRIFT_EVERY_S:
            self._drift_at = now
            try:
                self._drift = [c.describe() for c in self.sink.drift_flags()]
            except Exception:
                logger.exception("reading drift flags failed")
                self._drift = []
        return list(self._drift)

    def snapshot(self) -> SessionSnapshot:
        s = self._snap
        return replace(s, tokens_per_second=list(self._tps), acceptance=list(self._acc), drift=self.drift_flags())

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
