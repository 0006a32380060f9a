"""The request pipeline every long-running face shares: route, cache lookup, generate, cache store.

A face (the endpoint, the TUI) turns its input into a `GenerationRequest` and calls
`Pipeline.submit`, which returns a `Job`. A job has the engine `Handle`'s shape (an event queue,
a `done` flag, `cancel()`), so a face reads a cached answer, a local generation and a remote one
the same way. What the pipeline decided travels on the job: `job.cache` (hit, miss or bypass,
with the similarity and the matched prompt) and `job.route` (the tier and why).

    pipeline = Pipeline(tiers={"large": tier}, default_tier="large", cache=SemanticCache(...))
    job = pipeline.submit(request)
    for event in job: ...            # Token..., then Done

The cache key names the tier that answers (its model file's fingerprint), so a routed request
never sees another model's answer. Only deterministic requests are cached: see
`localspec.cache.policy`.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.cache import CacheScope, SemanticCache, cacheable
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Event, Stats, Token
from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker

logger = logging.getLogger(__name__)

_PIECE = re.compile(r"\s*\S+\s*|\s+")  # a cached answer streams word by word, like a generation


# ---------------------------------------------------------------- tiers


class LocalTier:
    """An engine in this process, stepped by its own worker thread."""

    def __init__(self, name: str, engine: Engine, model_id: str, draft_id: str | None, fingerprint: str,
                 owns_engine: bool = True) -> None:
        self.name = name
        self.engine = engine
        self.model_id = model_id
        self.draft_id = draft_id
        self.fingerprint = fingerprint
        self.owns_engine = owns_engine
        self.worker = EngineWorker(engine).start()

    def submit(self, request: GenerationRequest):
        """Validate and queue on the engine; raises RequestError subclasses for bad input."""
        return self.worker.submit(request)

    def close(self, drain: bool = False) -> None:
        self.worker.stop(drain=drain)
        if self.owns_engine:
            self.engine.close()


# ---------------------------------------------------------------- what travels on a job


@dataclass(frozen=True)
class CacheInfo:
    status: str  # "hit" | "miss" | "bypass"
    kind: str | None = None  # "exact" | "semantic" on a hit
    similarity: float | None = None
    matched_prompt: str | None = None
    entry_id: str | None = None
    reason: str | None = None  # why the cache was bypassed

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class CacheKey:
    scope: CacheScope
    prompt: str


class Job:
    """One request as a face sees it. `events` and `done` mirror the engine's Handle."""

    def __init__(self, request: GenerationRequest, tier: str) -> None:
        self.request = request
        self.tier = tier
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.done = threading.Event()
        self.result: Done | None = None
        self.cache: CacheInfo | None = None
        self.route: dict[str, Any] | None = None
        self.dropped_messages = 0
        self._cancel = threading.Event()
        self._handle = None  # the engine handle currently answering, if any
        self._worker: EngineWorker | None = None
        self._lock = threading.Lock()

    # the face's side

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.events.get()
            yield event
            if isinstance(event, Done):
                return

    def cancel(self) -> None:
        self._cancel.set()
        with self._lock:
            if self._handle is not None and self._worker is not None:
                self._worker.cancel(self._handle)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def cached(self) -> bool:
        return self.cache is not None and self.cache.status == "hit"

    # the pipeline's side

    def attach(self, worker: EngineWorker, handle) -> None:
        """The engine handle now answering; a cancel that came first reaches it."""
        with self._lock:
            self._worker, self._handle = worker, handle
            self.dropped_messages = int(getattr(handle, "dropped_messages", 0))
        if self._cancel.is_set():
            worker.cancel(handle)

    def emit(self, event: Event) -> None:
        self.events.put(event)

    def finish(self, done: Done) -> None:
        self.result = done
        self.events.put(done)
        self.done.set()


# ---------------------------------------------------------------- the pipeline


@dataclass
class PipelineSettings:
    cache: bool = True
    cache_sampled: bool = False  # also cache sampled answers (temperature > 0 without a seed)


@dataclass
class Pipeline:
    tiers: dict[str, LocalTier]
    default_tier: str
    cache: SemanticCache | None = None
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    on_finish: Callable[[Job], None] | None = None  # e.g. the face's metrics record

    def submit(self, request: GenerationRequest, tier: str | None = None, has_response_format: bool = False,
               use_cache: bool = True) -> Job:
        """Answer from the cache or queue on a tier. Raises RequestError subclasses for bad input."""
        name = tier or self.default_tier
        answering = self.tiers[name]
        job = Job(request, name)
        key = None
        if use_cache:
            key, bypass = self.cache_key(request, answering, has_response_format)
            if key is None:
                job.cache = CacheInfo("bypass", reason=bypass)
            else:
                t0 = time.perf_counter()
                hit = self.cache.lookup(key.scope, key.prompt) if self.cache else None
                if hit is not None:
                    job.cache = CacheInfo("hit", hit.kind, hit.similarity, hit.matched_prompt, hit.entry_id)
                    self._replay(job, hit, (time.perf_counter() - t0) * 1000)
                    return job
                job.cache = CacheInfo("miss")
        else:
            job.cache = CacheInfo("bypass", reason="disabled for this request")
        handle = answering.submit(request)  # raises for bad input before anything runs
        job.attach(answering.worker, handle)
        threading.Thread(target=self._pump, args=(job, handle, key), name="localspec-job", daemon=True).start()
        return job

    def cache_key(self, request: GenerationRequest, tier: LocalTier,
                  has_response_format: bool = False) -> tuple[CacheKey | None, str | None]:
        """The scope and prompt this request is cached under, or None and the reason it is not cached."""
        if self.cache is None or not self.settings.cache:
            return None, "cache off"
        if self.cache.mode == "off":
            return None, self.cache.describe()
        if request.logprobs is not None:
            return None, "logprobs requested"
        if not cacheable(request.sampling, opt_in=self.settings.cache_sampled):
            return None, "sampled request (temperature > 0 and no seed)"
        sampling = request.sampling.model_dump()
        sampling.update(max_tokens=request.max_tokens, stop=request.stop, grammar=request.grammar,
                        tools=request.tools)
        if request.sampling.temperature > 0:  # a seeded draw depends on the drafting path too
            sampling.update(mode=request.mode, k=request.k)
        if request.messages is not None:
            last = request.messages[-1]
            if last.role != "user":
                return None, "the last message is not the user's"
            system = "\n".join(m.content or "" for m in request.messages if m.role == "system")
            earlier = [m.model_dump(exclude_none=True) for m in request.messages[:-1] if m.role != "system"]
            scope = CacheScope.from_request(
                tier.fingerprint, system, earlier, sampling, bool(request.tools), has_response_format, kind="chat",
            )
            return CacheKey(scope, last.content or ""), None
        scope = CacheScope.from_request(tier.fingerprint, None, (), sampling, False, has_response_format,
                                        kind="completion")
        return CacheKey(scope, request.prompt or ""), None

    def mark_wrong(self, entry_id: str) -> bool:
        """The user says a cached answer was wrong: evict it and count a false hit."""
        return self.cache.mark_wrong(entry_id) if self.cache is not None else False

    def close(self, drain: bool = False) -> None:
        for t in self.tiers.values():
            t.close(drain=drain)
        if self.cache is not None:
            self.cache.close()

    # ------------------------------------------------------------ internals

    def _replay(self, job: Job, hit, lookup_ms: float) -> None:
        """Stream a cached answer like a generation, then a Done whose stats say it came from the cache."""
        for piece in _PIECE.findall(hit.answer):
            job.emit(Token(text=piece, ids=(), origin="cache"))
        stats = Stats(
            mode="cache", prompt_tokens=int(hit.stats.get("prompt_tokens", 0)),
            completion_tokens=len(hit.token_ids) or int(hit.stats.get("completion_tokens", 0)),
            ttft_ms=lookup_ms,
        )
        job.finish(Done(hit.stats.get("finish_reason", "stop"), stats, hit.answer))
        self._finished(job)

    def _pump(self, job: Job, handle, key: CacheKey | None) -> None:
        """Forward the engine's events to the job; store a finished deterministic answer."""
        ids: list[int] = []
        done: Done | None = None
        while done is None:
            event = handle.events.get()
            if isinstance(event, Done):
                done = event
                break
            ids.extend(event.ids)
            job.emit(event)
        if key is not None and self.cache is not None and done.finish_reason in ("stop", "length"):
            stats = {"prompt_tokens": done.stats.prompt_tokens, "completion_tokens": done.stats.completion_tokens,
                     "finish_reason": done.finish_reason, "tier": job.tier}
            self.cache.store(key.scope, key.prompt, done.text, ids, stats)  # never raises
        job.finish(done)
        self._finished(job)

    def _finished(self, job: Job) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(job)
            except Exception:  # a metrics failure never fails the request
                logger.exception("recording a finished request failed")
