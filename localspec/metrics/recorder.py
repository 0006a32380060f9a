"""`Metrics`: the one object every face calls once per request.

`record()` updates the Prometheus collectors in memory and queues the row; a writer thread owns
the SQLite connection and retries while another process holds the write lock, so a slow or
locked database never stalls generation.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from localspec.metrics import store
from localspec.metrics.prom import PromCollectors
from localspec.metrics.record import RequestRecord
from localspec.metrics.settings import MetricsSettings, load_metrics_settings

log = logging.getLogger(__name__)

_STOP = object()
_BATCH = 256
_RETRY_S = 0.05
_QUEUE_MAX = 100_000
_PRUNE_EVERY_S = 3600.0


@dataclasses.dataclass(frozen=True)
class _Feedback:
    request_id: str
    ts: float
    score: int
    kind: str


class Metrics:
    def __init__(
        self,
        db_path: Path | None = None,
        registry: CollectorRegistry | None = None,
        store_prompts: bool = False,
        retention_days: float | None = None,
        *,
        settings: MetricsSettings | None = None,
    ) -> None:
        self.settings = settings or MetricsSettings(store_prompts=store_prompts, retention_days=retention_days)
        self.store_prompts = store_prompts or self.settings.store_prompts
        self.retention_days = retention_days if retention_days is not None else self.settings.retention_days
        self.db_path = Path(db_path) if db_path is not None else store.default_db_path()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._prom = PromCollectors(self.registry)
        self._conn, self.recovered_from = store.open_db(self.db_path)
        self._q: queue.Queue = queue.Queue(maxsize=_QUEUE_MAX)
        self._cond = threading.Condition()
        self._enqueued = 0
        self._written = 0
        self._closed = False
        self._close_deadline = float("inf")
        self._last_prune: float | None = None
        self._thread = threading.Thread(target=self._run, name="localspec-metrics-writer", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, db_path: Path | None = None, registry: CollectorRegistry | None = None,
                      settings_file: Path | None = None) -> Metrics:
        """A `Metrics` configured by the `[metrics]` table of settings.toml."""
        s = load_metrics_settings(settings_file)
        return cls(db_path, registry, s.store_prompts, s.retention_days, settings=s)

    # ---------------------------------------------------------------- the faces' calls

    def record(self, rec: RequestRecord) -> None:
        """Log one finished request. Never waits on the database."""
        if not self.store_prompts and rec.prompt_text is not None:
            rec = dataclasses.replace(rec, prompt_text=None)
        try:
            self._prom.observe(rec)
        except Exception:  # a collector bug must not cost the request
            log.exception("metrics: updating Prometheus collectors failed")
        self._enqueue(rec)

    def feedback(self, request_id: str, score: int, kind: str) -> None:
        """Join user feedback to a request: kind "thumbs" with score +1/-1, or "cache_wrong"."""
        self._enqueue(_Feedback(request_id, time.time(), int(score), kind))

    def observe_inter_token(self, seconds: float) -> None:
        self._prom.inter_token.observe(seconds)

    def set_queue_depth(self, n: int) -> None:
        self._prom.queue_depth.set(n)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is written; False if `timeout` passed first."""
        with self._cond:
            target = self._enqueued
            return self._cond.wait_for(lambda: self._written >= target, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (giving up after `timeout` if the database stays locked) and stop."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._close_deadline = time.monotonic() + timeout
        self._q.put(_STOP)
        self._thread.join(timeout + 1.0)

    def __enter__(self) -> Metrics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- reports

    def prune(self, now: float | None = None) -> int:
        """Apply the retention setting now; returns the requests removed (0 without a setting)."""
        if not self.retention_days:
            return 0
        conn, _ = store.open_db(self.db_path)
        try:
            return store.prune(conn, self.retention_days, now)
        finally:
            conn.close()

    def drift_flags(self, now: float | None = None) -> list:
        """Active drift flags (recent window vs baseline), for the TUI's metrics pane."""
        from localspec.metrics.drift import detect_drift

        return detect_drift(self.db_path, self.settings.drift, now=now)

    # ---------------------------------------------------------------- the writer thread

    def _enqueue(self, item: object) -> None:
        with self._cond:
            if self._closed:
                log.debug("metrics: record after close dropped")
                return
            try:
                self._q.put_nowait(item)
            except queue.Full:
                self._prom.dropped.inc()
                return
            self._enqueued += 1

    def _mark_written(self, n: int) -> None:
        with self._cond:
            self._written += n
            self._cond.notify_all()

    def _run(self) -> None:
        pending: list[object] = []
        stopping = False
        try:
            while not (stopping and not pending):
                self._maybe_prune()
                if not pending:
                    item = self._q.get()
                    if item is _STOP:
                        stopping = True
                        continue
                    pending.append(item)
                while len(pending) < _BATCH:
                    try:
                        item = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    pending.append(item)
                if self._write(pending):
                    self._mark_written(len(pending))
                    pending = []
                elif stopping and time.monotonic() > self._close_deadline:
                    log.warning("metrics: database %s stayed locked; %d records not written",
                                self.db_path, len(pending))
                    self._mark_written(len(pending))
                    pending = []
                else:
                    time.sleep(_RETRY_S)
        finally:
            self._conn.close()

    def _write(self, items: list[object]) -> bool:
        """One transaction for the batch. False: locked, try again; True: written (or dropped)."""
        records = [i for i in items if isinstance(i, RequestRecord)]
        feedback = [(f.request_id, f.ts, f.score, f.kind) for f in items if isinstance(f, _Feedback)]
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                return False
            log.warning("metrics: cannot write to %s (%s); %d records dropped", self.db_path, exc, len(items))
            return True
        try:
            store.insert_records(conn, records)
            store.insert_feedback(conn, feedback)
            conn.execute("COMMIT")
            return True
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                return False
            log.warning("metrics: writing to %s failed (%s); %d records dropped", self.db_path, exc, len(items))
            return True

    def _maybe_prune(self) -> None:
        if not self.retention_days:
            return
        if self._last_prune is not None and time.monotonic() - self._last_prune < _PRUNE_EVERY_S:
            return
        self._last_prune = time.monotonic()
        try:
            n = store.prune(self._conn, self.retention_days)
            if n:
                log.debug("metrics: pruned %d requests older than %s days", n, self.retention_days)
        except sqlite3.Error as exc:  # locked or broken: try again next hour
            log.debug("metrics: pruning skipped (%s)", exc)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg
