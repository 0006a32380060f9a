"""The request pipeline every long-running face shares: route, cache lookup, generate, cache store.

A face (the endpoint, the TUI) turns its input into a `GenerationRequest` and calls
`Pipeline.submit`, which returns a `Job` (localspec.jobs): a face reads a cached answer, a local
generation and a remote one the same way, awaiting `job.subscribe()` or iterating the job. What
the pipeline decided travels on it: `job.cache` (hit, miss or bypass, with the similarity and the
matched prompt) and `job.route` (the tier, the scores and why).

    pipeline = Pipeline(tiers={TierName.LARGE: tier}, default_tier=TierName.LARGE, cache=SemanticCache(...))
    job = pipeline.submit(request, route="auto")
    for event in job: ...            # Token..., then Done

Every tier answers through one `Tier.start(request, sink=...)`: its events reach the pipeline's
sink on the thread that makes them (the engine's, or the remote stream's). Tokens go straight on
the job; the Done goes to one completion thread, which stores the answer in the cache, runs the
cascade's escalation or the remote fallback, and finishes the job.

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
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from localspec.cache import SemanticCache, cacheable
from localspec.cache.judge import ModelJudge
from localspec.cache.policy import cache_judge_kind
from localspec.cache.scope import LOCAL_OWNER, PromptKind
from localspec.cache.scorer import PairScorer, ScorerJudge
from localspec.cache.semantic import CacheHit
from localspec.cache import CacheScope
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Event, Stats, Token
from localspec.engine.prompt import split_prefill
from localspec.engine.scheduler import Engine
from localspec.engine.slots import EventSink, Handle, Lane
from localspec.engine.worker import EngineWorker
from localspec.jobs import CacheInfo, CacheKey, CacheStatus, Job, Route
from localspec.router import RemoteTier, RemoteUnavailable, RouteInput, Router, TierName

__all__ = ["CacheInfo", "CacheKey", "Job", "LocalTier", "Pipeline", "PipelineSettings", "RemoteRunner", "Route",
           "Started", "Tier", "TierName"]

logger = logging.getLogger(__name__)

_PIECE = re.compile(r"\s*\S+\s*|\s+")  # a cached answer streams word by word, like a generation


# ---------------------------------------------------------------- tiers


@dataclass(frozen=True)
class Started:
    """A tier's answer in progress, as the pipeline holds it."""

    cancel: Callable[[], None]
    dropped_messages: int = 0  # old turns the engine left out to fit its context


class Tier(Protocol):
    """Something that answers requests: an engine in this process, or a remote server."""

    name: TierName
    model_id: str
    fingerprint: str  # what a cached answer is keyed by: another model never sees it

    def start(self, request: GenerationRequest, *, sink: EventSink) -> Started:
        """Begin answering; events go to `sink` (Tokens, then one Done).
        Raises RequestError subclasses for bad input, before anything runs."""
        ...

    def close(self, drain: bool = False) -> None: ...


class LocalTier:
    """An engine in this process, stepped by its own worker thread."""

    def __init__(self, name: TierName | str, engine: Engine, model_id: str, draft_id: str | None, fingerprint: str,
                 owns_engine: bool = True) -> None:
        self.name = TierName(name)
        self.engine = engine
        self.model_id = model_id
        self.draft_id = draft_id
        self.fingerprint = fingerprint
        self.owns_engine = owns_engine
        self.worker = EngineWorker(engine).start()

    def start(self, request: GenerationRequest, *, sink: EventSink) -> Started:
        handle = self.worker.submit(request, sink=sink)
        return Started(functools.partial(self.worker.cancel, handle), handle.dropped_messages)

    def submit(self, request: GenerationRequest, *, lane: Lane = Lane.GENERATION) -> Handle:
        """Queue on the engine and read the handle's own queue (the reuse judge, scripts)."""
        return self.worker.submit(request, lane=lane)

    @functools.cached_property
    def judge(self) -> ModelJudge:
        """This tier's model as the cache's reuse judge, in the engine's judge lane: a lookup is
        admitted before queued generations, so it never waits behind them for a slot."""
        return ModelJudge(functools.partial(self.submit, lane=Lane.JUDGE),
                          lambda w: self.engine.target.tokenize(w, add_special=False), name=self.model_id)

    def close(self, drain: bool = False) -> None:
        self.worker.stop(drain=drain)
        if self.owns_engine:
            self.engine.close()


class RemoteRunner:
    """The remote tier (an OpenAI-compatible server): a stream read on a thread of its own."""

    def __init__(self, remote: RemoteTier) -> None:
        self.remote = remote
        self.name = TierName(remote.spec.name)
        self.model_id = remote.spec.model or ""
        self.fingerprint = f"remote:{remote.spec.base_url}#{remote.spec.model}"

    def start(self, request: GenerationRequest, *, sink: EventSink) -> Started:
        cancel = threading.Event()
        threading.Thread(target=self._stream, args=(request, sink, cancel), name="localspec-remote",
                         daemon=True).start()
        return Started(cancel.set)

    def _stream(self, request: GenerationRequest, sink: EventSink, cancel: threading.Event) -> None:
        """Deltas as Tokens, then a Done; an unavailable server ends it with a RemoteUnavailableDone."""
        stats = Stats(mode="remote")
        t0 = time.perf_counter()
        text: list[str] = []
        if request.messages is not None:
            messages = [m.model_dump(include={"role", "content"}) for m in request.messages]
        else:
            messages = [{"role": "user", "content": request.prompt or ""}]
        try:
            for piece in self.remote.stream_chat(messages, request.max_tokens, request.sampling.temperature,
                                                 request.sampling.seed, request.stop or None, cancel,
                                                 prediction=request.prediction, template_vars=request.template_vars):
                if not text:
                    stats.ttft_ms = (time.perf_counter() - t0) * 1000
                text.append(piece)
                sink(Token(text=piece, ids=(), origin="target"))
        except RemoteUnavailable as exc:
            sink(RemoteUnavailableDone("error", stats, "".join(text), error=exc.cause, before_first_token=not text))
            return
        stats.completion_tokens = len(text)
        stats.decode_ms = (time.perf_counter() - t0) * 1000 - stats.ttft_ms
        sink(Done("cancelled" if cancel.is_set() else "stop", stats, "".join(text)))

    def close(self, drain: bool = False) -> None:
        client = self.remote._client
        if client is not None:
            client.close()


@dataclass(frozen=True)
class RemoteUnavailableDone(Done):
    """The remote tier could not answer; before its first token the pipeline answers locally instead."""

    before_first_token: bool = False


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


# What the completion thread does with a finished answer: its Done and the tokens behind it.
Then = Callable[[Done, list[Token]], None]


@dataclass
class Pipeline:
    tiers: dict[TierName, LocalTier | RemoteRunner]
    default_tier: TierName
    cache: SemanticCache | None = None
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    on_finish: Callable[[Job], None] | None = None  # e.g. the face's metrics record
    router: Router | None = None
    load_tier: Callable[[TierName], LocalTier | RemoteRunner] | None = None  # tiers not loaded up front
    _load_lock: threading.Lock = field(default_factory=threading.Lock)
    # One thread finishes every job (cache store, escalation, fallback): never the engine's thread.
    _completion: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-complete"))

    def __post_init__(self) -> None:
        self.tiers = {TierName(k): v for k, v in self.tiers.items()}
        self.default_tier = TierName(self.default_tier)
        # The judge's instructions and examples take one long prefill (seconds on a CPU), then stay
        # pinned in the engine: do it now, in the background, not on the first semantic lookup.
        judging = self.tiers.get(self.default_tier)
        if (self.cache is not None and self.cache.embedder is not None and self.settings.cache_judge == "model"
                and isinstance(judging, LocalTier)):
            judging.judge.warm()
        if self.settings.cache_judge == "scorer":
            _ = self._scorer_judge  # load the weights now: a mismatch is reported at start-up

    def submit(self, request: GenerationRequest, *, route: str | None = None, grammar_enforced: bool = False,
               use_cache: bool = True, bypass_reason: str | None = None, owner: str = LOCAL_OWNER) -> Job:
        """Route, answer from the cache or start a tier. Raises RequestError subclasses for bad input.

        `route`: "auto" asks the router; a tier name ("small", "large", "remote") is explicit; None
        is the default tier. `bypass_reason`: why `use_cache` is False, for the cache's verdict, when
        the request did not simply opt out. `owner`: whose cache entries this request may see and make
        (an API key's).
        """
        if request.history_scope != owner:  # lookup copies only from this owner's earlier requests
            request = request.model_copy(update={"history_scope": owner})
        decided = self._route(request, route)
        job = Job(request, decided.tier if decided else self.default_tier, route=decided)
        answering = self.tier(job.tier)
        key = self._cache_key_for(job, answering, grammar_enforced=grammar_enforced, owner=owner) if use_cache else None
        if not use_cache:
            job.cache = CacheInfo(CacheStatus.BYPASS, reason=bypass_reason or "disabled for this request")
        if key is not None and self._answer_from_cache(job, key):
            return job
        if decided is not None and decided.decision is not None and decided.decision.cascade:
            # The small tier answers first, unseen, with logprobs for the escalation rule.
            first = request.model_copy(update={"logprobs": request.logprobs or 0})
            self._generate(job, answering, first, forward=False,
                           then=functools.partial(self._after_small_tier, job, key))
        else:
            self._generate(job, answering, request, forward=True, then=functools.partial(self._complete, job, key))
        return job

    def tier(self, name: TierName | str) -> LocalTier | RemoteRunner:
        """A tier by name, loading it on first use."""
        name = TierName(name)
        with self._load_lock:
            if name not in self.tiers:
                if self.load_tier is None:
                    raise KeyError(f"no tier {name!r} (have {sorted(self.tiers)})")
                self.tiers[name] = self.load_tier(name)
            return self.tiers[name]

    def _route(self, request: GenerationRequest, route: str | None) -> Route | None:
        if route == "auto" and self.router is not None:
            decision = self.router.decide(RouteInput.from_request(request))
            return Route(decision.tier, decision.reason, decision)
        if route and route != "auto":
            name = TierName(route)
            return Route(name, f"the request named the {name} tier")
        return None

    def _cache_key_for(self, job: Job, tier: LocalTier | RemoteRunner, *, grammar_enforced: bool,
                       owner: str) -> CacheKey | None:
        key, bypass = self.cache_key(job.request, tier, grammar_enforced=grammar_enforced, owner=owner)
        job.cache = CacheInfo(CacheStatus.BYPASS, reason=bypass) if key is None else None
        return key

    def cache_key(self, request: GenerationRequest, tier: LocalTier | RemoteRunner, *, grammar_enforced: bool = False,
                  owner: str = LOCAL_OWNER) -> tuple[CacheKey | None, str | None]:
        """The scope and prompt this request is cached under, or None and the reason it is not cached."""
        if isinstance(tier, LocalTier):  # key what the engine will run: its model's defaults applied
            request = tier.engine.with_defaults(request)
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
        if request.template_vars:  # only when set: the scopes of requests without them stay as they were
            sampling.update(template_vars=request.template_vars)
        if request.sampling.temperature > 0:  # a seeded draw depends on the drafting path too
            sampling.update(mode=request.mode, k=request.k)
        if request.messages is not None:
            # A prefill's answer is its continuation, not the question's: never served as, nor serving, one.
            messages, prefill = split_prefill(request.messages)
            if prefill:
                return None, "an assistant prefill (the answer continues the last message)"
            last = messages[-1] if messages else None
            if last is None or last.role != "user":
                return None, "the last message is not the user's"
            system = "\n".join(m.content or "" for m in messages if m.role == "system")
            earlier = [m.model_dump(exclude_none=True) for m in messages[:-1] if m.role != "system"]
            scope = CacheScope.from_request(
                tier.fingerprint, system, earlier, sampling, bool(request.tools), grammar_enforced,
                kind=PromptKind.CHAT, owner=owner,
            )
            return CacheKey(scope, last.content or ""), None
        scope = CacheScope.from_request(tier.fingerprint, None, (), sampling, False, grammar_enforced,
                                        kind=PromptKind.COMPLETION, owner=owner)
        return CacheKey(scope, request.prompt or ""), None

    def _answer_from_cache(self, job: Job, key: CacheKey) -> bool:
        t0 = time.perf_counter()
        hit = self._lookup(key)
        if hit is None:
            job.cache = CacheInfo(CacheStatus.MISS)
            return False
        job.cache = CacheInfo(CacheStatus.HIT, hit.kind, hit.similarity, hit.matched_prompt, hit.entry_id, hit.judge,
                              remembered=hit.remembered, judged_by=hit.judged_by)
        self._replay(job, hit, (time.perf_counter() - t0) * 1000)
        return True

    def _lookup(self, key: CacheKey) -> CacheHit | None:
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
        self._completion.shutdown(wait=True)
        if self.cache is not None:
            self.cache.close()

    # ------------------------------------------------------------ answering

    def _replay(self, job: Job, hit: CacheHit, lookup_ms: float) -> None:
        """Stream a cached answer like a generation, then a Done whose stats say it came from the cache."""
        for piece in _PIECE.findall(hit.answer):
            job.emit(Token(text=piece, ids=(), origin="cache"))
        stats = Stats(
            mode="cache", prompt_tokens=int(hit.stats.get("prompt_tokens", 0)),
            completion_tokens=len(hit.token_ids) or int(hit.stats.get("completion_tokens", 0)),
            ttft_ms=lookup_ms,
        )
        self._finish(job, Done(hit.stats.get("finish_reason", "stop"), stats, hit.answer,
                               stop_sequence=hit.stats.get("stop_sequence")))

    def _generate(self, job: Job, tier: LocalTier | RemoteRunner, request: GenerationRequest, *, forward: bool,
                  then: Then) -> None:
        """Start `tier` on `request`. Its tokens go on the job as they come (`forward`) or are held;
        its Done, with every token, goes to `then` on the completion thread."""
        tokens: list[Token] = []

        def sink(event: Event) -> None:  # on the tier's thread: quick, never blocking
            if isinstance(event, Done):
                self._completion.submit(self._guard, job, then, event, tokens)
                return
            tokens.append(event)
            if forward:
                job.emit(event)

        started = tier.start(request, sink=sink)  # raises for bad input before anything runs
        job.attach(started.cancel, dropped_messages=started.dropped_messages)

    def _guard(self, job: Job, then: Then, done: Done, tokens: list[Token]) -> None:
        """A bug after the answer must still end the request, or its client waits for ever."""
        try:
            then(done, tokens)
        except Exception as exc:
            logger.exception("finishing request failed")
            if not job.done.is_set():
                self._finish(job, Done("error", done.stats, done.text, error=f"{type(exc).__name__}: {exc}"))

    def _after_small_tier(self, job: Job, key: CacheKey | None, done: Done, held: list[Token]) -> None:
        """The cascade: keep the small tier's answer unless the escalation rule says it is unsure."""
        if isinstance(done, RemoteUnavailableDone) and done.before_first_token:
            self._fall_back(job, done)
            return
        route, router = job.route, self.router
        if done.finish_reason in ("stop", "length") and not job.cancelled and route and router:
            lps = [t.logprob.logprob for t in held if t.logprob is not None]
            mean = sum(lps) / len(lps) if lps else None
            up, why = router.should_escalate(mean, done.text, RouteInput.from_request(job.request))
            route.escalated, route.escalation_reason = up, why
            route.mean_logprob = None if mean is None else round(mean, 4)
            if up and route.decision is not None:
                target = router.escalation_tier(route.decision).name
                route.tier = job.tier = target
                try:  # the cache key named the small tier: the larger one's answer is not stored under it
                    self._generate(job, self.tier(target), job.request, forward=True,
                                   then=functools.partial(self._complete, job, None))
                    return
                except Exception as exc:  # e.g. the larger tier's context is smaller: keep the small answer
                    route.escalation_reason = f"{why}; escalation failed ({exc}), kept the small answer"
        for token in held:
            job.emit(token if job.request.logprobs is not None else dataclasses.replace(token, logprob=None))
        self._complete(job, key, done, held)

    def _fall_back(self, job: Job, done: Done) -> None:
        """The remote tier could not start: the best local tier answers instead."""
        local = self.router.best_local().name if self.router else self.default_tier
        if job.route is None:
            job.route = Route(job.tier, "the default tier")
        job.route.fallback = f"{job.tier} unavailable: {done.error}"
        job.route.tier = job.tier = local
        logger.warning("remote tier unavailable, answering with %s: %s", local, done.error)
        try:
            self._generate(job, self.tier(local), job.request, forward=True,
                           then=functools.partial(self._complete, job, None))
        except Exception as err:
            self._finish(job, Done("error", Stats(), "", error=str(err)))

    def _complete(self, job: Job, key: CacheKey | None, done: Done, tokens: list[Token]) -> None:
        """Store a finished answer (before the face sees Done, so a repeat right after hits), then finish."""
        if isinstance(done, RemoteUnavailableDone) and done.before_first_token:
            self._fall_back(job, done)
            return
        if key is not None and self.cache is not None and done.finish_reason in ("stop", "length"):
            ids = [i for t in tokens for i in t.ids]
            stats = {"prompt_tokens": done.stats.prompt_tokens, "completion_tokens": done.stats.completion_tokens,
                     "finish_reason": done.finish_reason, "tier": str(job.tier),
                     "stop_sequence": done.stop_sequence}  # a hit says which stop string ended it, as the answer did
            self.cache.store(key.scope, key.prompt, done.text, ids, stats)  # never raises
        self._finish(job, done)

    def _finish(self, job: Job, done: Done) -> None:
        """The face's completion hook (its metrics record) runs before the face sees Done, so what
        a client reads right after its answer already counts it."""
        job.result = done
        if self.on_finish is not None:
            try:
                self.on_finish(job)
            except Exception:  # a metrics failure never fails the request
                logger.exception("recording a finished request failed")
        job.finish(done)
