"""The request pipeline every long-running face shares: route, cache lookup, generate, cache store.

A face (the endpoint, the TUI) turns its input into a `GenerationRequest` and calls
`Pipeline.submit`, which returns a `Job`. A job has the engine `Handle`'s shape (an event queue,
a `done` flag, `cancel()`), so a face reads a cached answer, a local generation and a remote one
the same way. What the pipeline decided travels on the job: `job.cache` (hit, miss or bypass,
with the similarity and the matched prompt) and `job.route` (the tier, the scores and why).

    pipeline = Pipeline(tiers={"large": tier}, default_tier="large", cache=SemanticCache(...))
    job = pipeline.submit(request, route="auto")
    for event in job: ...            # Token..., then Done

Stages, in order:
1. route: `route="auto"` asks the router for a tier; a tier name is explicit and bypasses it;
   None is the default tier;
2. cache lookup, keyed by the answering tier's fingerprint, so a routed request never sees
   another model's answer (only deterministic requests are cached: `localspec.cache.policy`);
3. generate: a local tier's engine; a cascade (the small tier first, kept unless the router's
   escalation rule says it is unsure, in which case the user sees only the larger tier's answer);
   or the remote tier, falling back to the best local tier when it is unavailable;
4. cache store of a finished answer.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.cache import CacheScope, SemanticCache, cacheable
from localspec.cache.scope import LOCAL_OWNER
from localspec.cache.judge import ModelJudge
from localspec.cache.policy import cache_judge_kind
from localspec.cache.scorer import PairScorer, ScorerJudge
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Event, Stats, Token
from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker
from localspec.router import RemoteTier, RemoteUnavailable, RouteDecision, RouteInput, Router

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

    @functools.cached_property
    def judge(self) -> ModelJudge:
        """This tier's model as the cache's reuse judge: whether a cached answer serves a new request."""
        return ModelJudge(self.submit, lambda w: self.engine.target.tokenize(w, add_special=False), name=self.model_id)

    def close(self, drain: bool = False) -> None:
        self.worker.stop(drain=drain)
        if self.owns_engine:
            self.engine.close()


class RemoteRunner:
    """The remote tier (an OpenAI-compatible server) as the pipeline drives it."""

    def __init__(self, remote: RemoteTier) -> None:
        self.remote = remote
        self.name = remote.spec.name
        self.model_id = remote.spec.model or ""
        self.fingerprint = f"remote:{remote.spec.base_url}#{remote.spec.model}"

    def stream(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[str]:
        """Text deltas; raises RemoteUnavailable before the first one when the tier cannot start."""
        if request.messages is not None:
            messages = [m.model_dump(include={"role", "content"}) for m in request.messages]
        else:
            messages = [{"role": "user", "content": request.prompt or ""}]
        return self.remote.stream_chat(messages, request.max_tokens, request.sampling.temperature,
                                       request.sampling.seed, request.stop or None, cancel)

    def close(self, drain: bool = False) -> None:
        client = self.remote._client
        if client is not None:
            client.close()


# ---------------------------------------------------------------- what travels on a job


@dataclass(frozen=True)
class CacheInfo:
    status: str  # "hit" | "miss" | "bypass"
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
    def cancel_event(self) -> threading.Event:
        return self._cancel

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
    # A semantic hit is served only when the default tier's model agrees the two requests ask for
    # the same thing (localspec.cache.judge); without a local default tier, exact hits only.
    # "scorer": the learned pair scorer decides (localspec.cache.scorer); "rules": the guard and a
    # similarity threshold alone. (cache.policy.CACHE_JUDGES; True/False mean "model"/"rules".)
    cache_judge: bool | str = "model"

    def __post_init__(self) -> None:
        self.cache_judge = cache_judge_kind(self.cache_judge)


@dataclass
class Pipeline:
    tiers: dict[str, LocalTier | RemoteRunner]
    default_tier: str
    cache: SemanticCache | None = None
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    on_finish: Callable[[Job], None] | None = None  # e.g. the face's metrics record
    router: Router | None = None
    load_tier: Callable[[str], LocalTier | RemoteRunner] | None = None  # tiers not loaded up front
    _load_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # The judge's instructions and examples take one long prefill (seconds on a CPU), then stay
        # pinned in the engine: do it now, in the background, not on the first semantic lookup.
        judging = self.tiers.get(self.default_tier)
        if (self.cache is not None and self.cache.embedder is not None and self.settings.cache_judge == "model"
                and isinstance(judging, LocalTier)):
            judging.judge.warm()
        if self.settings.cache_judge == "scorer":
            _ = self._scorer_judge  # load the weights now: a mismatch is reported at start-up

    def submit(self, request: GenerationRequest, route: str | None = None, has_response_format: bool = False,
               use_cache: bool = True, *, owner: str = LOCAL_OWNER) -> Job:
        """Route, answer from the cache or queue on a tier. Raises RequestError subclasses for bad input.

        `route`: "auto" asks the router; a tier name ("small", "large", "remote") is explicit; None
        is the default tier. `owner`: whose cache entries this request may see and make (an API key's).
        """
        decision = self._decide(request, route)
        name = decision.tier if decision else (route if route and route != "auto" else self.default_tier)
        answering = self.tier(name)
        job = Job(request, name)
        if decision is not None:
            job.route = decision.as_dict()
        elif route and route != "auto":
            job.route = {"tier": name, "policy": "explicit", "reason": f"the request named the {name} tier"}
        key = None
        if use_cache:
            key, bypass = self.cache_key(request, answering, has_response_format, owner=owner)
            if key is None:
                job.cache = CacheInfo("bypass", reason=bypass)
            else:
                t0 = time.perf_counter()
                hit = self._lookup(key)
                if hit is not None:
                    job.cache = CacheInfo("hit", hit.kind, hit.similarity, hit.matched_prompt, hit.entry_id, hit.judge,
                                          remembered=hit.remembered, judged_by=hit.judged_by)
                    self._replay(job, hit, (time.perf_counter() - t0) * 1000)
                    return job
                job.cache = CacheInfo("miss")
        else:
            job.cache = CacheInfo("bypass", reason="disabled for this request")
        if isinstance(answering, RemoteRunner):
            self._start(self._run_remote, job, answering, key)
            return job
        cascade = decision is not None and decision.cascade
        first = request.model_copy(update={"logprobs": request.logprobs or 0}) if cascade else request
        handle = answering.submit(first)  # raises for bad input before anything runs
        job.attach(answering.worker, handle)
        if cascade:
            self._start(self._run_cascade, job, handle, key, decision)
        else:
            self._start(self._run_local, job, handle, key)
        return job

    def tier(self, name: str) -> LocalTier | RemoteRunner:
        """A tier by name, loading it on first use."""
        with self._load_lock:
            if name not in self.tiers:
                if self.load_tier is None:
                    raise KeyError(f"no tier {name!r} (have {sorted(self.tiers)})")
                self.tiers[name] = self.load_tier(name)
            return self.tiers[name]

    def _decide(self, request: GenerationRequest, route: str | None) -> RouteDecision | None:
        if route != "auto" or self.router is None:
            return None
        return self.router.decide(RouteInput.from_request(request))

    def cache_key(self, request: GenerationRequest, tier: LocalTier, has_response_format: bool = False, *,
                  owner: str = LOCAL_OWNER) -> tuple[CacheKey | None, str | None]:
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
                owner=owner,
            )
            return CacheKey(scope, last.content or ""), None
        scope = CacheScope.from_request(tier.fingerprint, None, (), sampling, False, has_response_format,
                                        kind="completion", owner=owner)
        return CacheKey(scope, request.prompt or ""), None

    def _lookup(self, key: CacheKey):
        if self.cache is None:
            return None
        if self.settings.cache_judge == "scorer" and self._scorer_judge is not None:
            return self.cache.lookup(key.scope, key.prompt, judge=self._scorer_judge)
        if self.settings.cache_judge != "model":  # rules, or a scorer whose weights do not fit
            return self.cache.lookup(key.scope, key.prompt)
        # The default tier's model (the large one, loaded at start) judges for every tier: the 0.5B
        # cannot tell a paraphrase from a trap (its yes/no margins do not separate them on the dev pairs).
        judging = self.tiers.get(self.default_tier)
        judge = judging.judge if isinstance(judging, LocalTier) else None
        return self.cache.lookup(key.scope, key.prompt, judge=judge, semantic=judge is not None)

    @property
    def semantic_judge(self) -> str | None:
        """Who confirms a near-duplicate in practice (None: exact matches only): "model:<id>",
        the pair scorer's name, or "rules" (asked for, or the scorer's weights did not fit)."""
        if self.cache is None or self.cache.embedder is None:
            return None
        kind = self.settings.cache_judge
        if kind == "scorer" and self._scorer_judge is not None:
            return self._scorer_judge.name
        if kind != "model":
            return "rules"
        judging = self.tiers.get(self.default_tier)
        return f"model:{judging.model_id}" if isinstance(judging, LocalTier) else None

    @functools.cached_property
    def _scorer_judge(self) -> ScorerJudge | None:
        """The shipped pair scorer on the cache's embedder; None (rules alone, with a warning) when
        its weights were trained on another embedding model's vectors or cannot be read."""
        embedder = self.cache.embedder if self.cache is not None else None
        if embedder is None:
            return None
        try:
            return ScorerJudge(PairScorer.load(), embedder)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("pair scorer unusable, near-duplicates decided by the guard's rules alone: %s", exc)
            return None

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

    @staticmethod
    def _start(target, *args) -> None:
        threading.Thread(target=target, args=args, name="localspec-job", daemon=True).start()

    @staticmethod
    def _collect(handle, sink: Callable[[Token], None]) -> tuple[Done, list[int]]:
        """Hand the engine's tokens to `sink` until its Done; returns the Done and the token ids."""
        ids: list[int] = []
        while True:
            event = handle.events.get()
            if isinstance(event, Done):
                return event, ids
            ids.extend(event.ids)
            sink(event)

    def _run_local(self, job: Job, handle, key: CacheKey | None) -> None:
        done, ids = self._collect(handle, job.emit)
        self._complete(job, done, ids, key)

    def _run_cascade(self, job: Job, handle, key: CacheKey | None, decision: RouteDecision) -> None:
        """The small tier answers first, unseen; keep it unless the escalation rule says it is unsure."""
        held: list[Token] = []
        done, ids = self._collect(handle, held.append)
        if done.finish_reason in ("stop", "length") and not job.cancelled:
            lps = [t.logprob.logprob for t in held if t.logprob is not None]
            mean = sum(lps) / len(lps) if lps else None
            up, why = self.router.should_escalate(mean, done.text, RouteInput.from_request(job.request))
            job.route = {**(job.route or {}), "escalated": up, "escalation_reason": why,
                         "mean_logprob": None if mean is None else round(mean, 4)}
            if up:
                target = self.router.escalation_tier(decision).name
                job.route["tier"], job.tier = target, target
                answering = self.tier(target)
                if isinstance(answering, RemoteRunner):
                    self._run_remote(job, answering, None)
                    return
                try:
                    handle = answering.submit(job.request)
                except Exception as exc:  # e.g. the larger tier's context is smaller: answer with the small one
                    job.route["escalation_reason"] += f"; escalation failed ({exc}), kept the small answer"
                else:
                    job.attach(answering.worker, handle)
                    self._run_local(job, handle, None)  # the cache key named the small tier
                    return
        for token in held:
            job.emit(token if job.request.logprobs is not None else dataclasses.replace(token, logprob=None))
        self._complete(job, done, ids, key)

    def _run_remote(self, job: Job, runner: RemoteRunner, key: CacheKey | None) -> None:
        """Stream from the remote tier; when it cannot start, fall back to the best local tier."""
        stats = Stats(mode="remote")
        t0 = time.perf_counter()
        text: list[str] = []
        try:
            deltas = runner.stream(job.request, job.cancel_event)
            for piece in deltas:
                if not text:
                    stats.ttft_ms = (time.perf_counter() - t0) * 1000
                text.append(piece)
                job.emit(Token(text=piece, ids=(), origin="target"))
        except RemoteUnavailable as exc:
            if text:  # it broke mid-answer: the user has seen part of it, so say so
                job.finish(Done("error", stats, "".join(text), error=exc.cause))
                self._finished(job)
                return
            self._fall_back(job, exc)
            return
        stats.completion_tokens = len(text)
        stats.decode_ms = (time.perf_counter() - t0) * 1000 - stats.ttft_ms
        reason = "cancelled" if job.cancelled else "stop"
        self._complete(job, Done(reason, stats, "".join(text)), [], key)

    def _fall_back(self, job: Job, exc: RemoteUnavailable) -> None:
        local = self.router.best_local().name if self.router else self.default_tier
        job.route = {**(job.route or {}), "tier": local, "fallback": f"{job.tier} unavailable: {exc.cause}"}
        job.tier = local
        logger.warning("remote tier unavailable, answering with %s: %s", local, exc.cause)
        answering = self.tier(local)
        try:
            handle = answering.submit(job.request)
        except Exception as err:
            job.finish(Done("error", Stats(), "", error=str(err)))
            self._finished(job)
            return
        job.attach(answering.worker, handle)
        self._run_local(job, handle, None)

    def _complete(self, job: Job, done: Done, ids: list[int], key: CacheKey | None) -> None:
        """Store a finished answer (before the face sees Done, so a repeat right after hits), then finish."""
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
