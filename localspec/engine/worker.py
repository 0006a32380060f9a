"""Run the engine's step loop on a background thread, for faces that serve many callers.

The engine itself is single-threaded: only this thread calls `step()`. Other threads submit
requests (queued under the engine's lock) with a sink that receives their events on this thread,
or read them from the handle's queue, and cancel through the handle.
"""

from __future__ import annotations

import logging
import threading

from localspec.engine.config import GenerationRequest
from localspec.engine.scheduler import Engine, Handle
from localspec.engine.slots import EventSink, Lane

logger = logging.getLogger(__name__)


class EngineWorker:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="localspec-engine", daemon=True)

    def start(self) -> EngineWorker:
        self._thread.start()
        return self

    def submit(self, request: GenerationRequest, *, sink: EventSink | None = None,
               lane: Lane = Lane.GENERATION) -> Handle:
        """Validate and queue; raises RequestError subclasses synchronously for bad input."""
        handle = self.engine.submit(request, sink=sink, lane=lane)
        self._wake.set()
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancel()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.engine.busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                self.engine.step()
            except Exception as exc:
                # The step fails a faulty slot's request itself; a fault it could not place would
                # recur on every step, so it ends every request once instead of looping on them.
                logger.exception("engine step raised; failing its requests")
                self.engine.fail_all(exc)

    def stop(self, drain: bool = False, timeout: float = 30.0) -> None:
        """Stop the loop. With drain, running requests finish first; otherwise they are cancelled."""
        if not drain:
            for slot in self.engine.slots:
                if slot.active:
                    slot.active.handle.cancel()
            with self.engine._lock:
                pending = list(self.engine._pending)
            for p in pending:
                p.handle.cancel()
        deadline = threading.Event()
        waited = 0.0
        while self.engine.busy and waited < timeout:
            self._wake.set()
            deadline.wait(0.05)
            waited += 0.05
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
