"""Where replies come from, behind one small interface the app drives from a worker thread.

* `LocalBackend`: the engine in this process, stepped by an `EngineWorker` thread.
* `RemoteBackend`: any OpenAI-compatible endpoint (e.g. `localspec serve`), streamed.
* `ReplayBackend`: a recorded event stream; tests, snapshots and the README screenshot use it.

Every backend yields the engine's own events (`Token`, `Done`), so the app renders one shape.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from localspec.engine.config import GenerationRequest
from localspec.attach.remote import (RemoteGeneration, ServedPair, api_base, openai_client, remote_error,
                                     served_pair)
from localspec.engine.events import Done, Event, ProgressFn, Stats, Token
from localspec.errors import LocalspecError

if TYPE_CHECKING:  # the engine and the pipeline load only when a backend is built
    from localspec.cache import SemanticCache
    from localspec.engine.scheduler import Engine
    from localspec.jobs import Job
    from localspec.pipeline import Pipeline
    from localspec.settings import CacheTable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendInfo:
    kind: str  # "in-process" | "remote" | "replay"
    target: str
    draft: str | None = None
    accelerator: str = "CPU"  # CPU | CUDA | Metal | GPU | remote
    n_ctx: int | None = None
    profile: str | None = None
    url: str | None = None
    # The server records each reply in this machine's metrics log (attached): the app must not again.
    logged_by_server: bool = False
    # A recording's prompt opened a thought (the answer holds only its `</think>`); None: it did not say.
    opens_thought: bool | None = None


class Generation(Protocol):
    """One running reply. Iterating blocks for the next event and ends after `Done`; the app reads
    the properties once the reply is done."""

    @property
    def dropped_messages(self) -> int:
        """Turns the truncate policy removed to fit the context."""
        ...

    @property
    def cached(self) -> bool | None:
        """A cache hit (None: this backend has no cache)."""
        ...

    @property
    def cache_entry(self) -> str | None:
        """The handle `Backend.mark_wrong` takes for a cached answer (None: not from the cache)."""
        ...

    @property
    def route(self) -> str | None:
        """The router's decision, e.g. "small (heuristic score 0.2)" (None: no router)."""
        ...

    def __iter__(self) -> Iterator[Event]: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    @property
    def info(self) -> BackendInfo: ...

    def start(self, request: GenerationRequest, route: str | None = None) -> Generation:
        """Queue a request; raises LocalspecError (e.g. ContextOverflowError) for bad input.

        `route`: "auto" lets the router pick the tier, a tier name picks it; None: the default."""
        ...

    def mark_wrong(self, entry_id: str) -> bool:
        """Evict a cached answer the user marked wrong (F3); False when it was already gone."""
        ...

    def opens_thought(self, request: GenerationRequest) -> bool | None:
        """Whether this request's prompt opens a thought (the answer holds only its `</think>`), as its
        template variables render it; None when it cannot say (a server sends the thought in its tags)."""
        ...

    def close(self) -> None: ...


class BackendFactory(Protocol):
    """Builds the backend for a profile (None: the active one) on the app's loading thread.

    `on_progress` is the app's: a backend that loads models hands it to the engine, so the app
    can show the load and the one-time calibration; one that loads nothing may ignore it."""

    def __call__(self, profile: str | None, *, on_progress: ProgressFn) -> Backend: ...


def detect_accelerator() -> str:
    """CPU, or the GPU backend llama.cpp was built with."""
    try:
        import llama_cpp

        if not llama_cpp.llama_supports_gpu_offload():
            return "CPU"
        if sys.platform == "darwin":
            return "Metal"
        info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
        for name in ("CUDA", "ROCm", "HIP", "Vulkan", "SYCL"):
            if name in info:
                return name
        return "GPU"
    except Exception:  # a broken build shows in generation, not here
        return "CPU"


# ---------------------------------------------------------------------- in-process


class _LocalGeneration:
    """A pipeline job (cache lookup, then the engine) as the app reads it."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self.dropped_messages = job.dropped_messages

    @property
    def cached(self) -> bool:
        return self._job.cached

    @property
    def cache_entry(self) -> str | None:
        cache = self._job.cache
        return cache.entry_id if cache is not None and self._job.cached else None

    @property
    def route(self) -> str | None:
        route = self._job.route
        return f"{route.tier} ({route.reason})" if route else None

    def __iter__(self) -> Iterator[Event]:
        return iter(self._job)

    def cancel(self) -> None:
        self._job.cancel()


class LocalBackend:
    """The engine in this process behind the shared request pipeline (semantic cache included).

    `owns_engine=False` leaves closing the engine to the caller (tests). `cache`: a SemanticCache,
    None for none; `open` builds the profile's (semantic with the embedding model, else exact).
    """

    def __init__(self, engine: Engine, profile: str | None = None, target: str = "", draft: str | None = None,
                 owns_engine: bool = True, cache: SemanticCache | None = None, fingerprint: str = "",
                 pipeline: Pipeline | None = None) -> None:
        from localspec.pipeline import LocalTier, Pipeline, TierName

        self.engine = engine
        self.owns_engine = owns_engine
        if pipeline is None:
            tier = LocalTier(TierName.LARGE, engine, target, draft, fingerprint or target, owns_engine=owns_engine)
            pipeline = Pipeline({TierName.LARGE: tier}, TierName.LARGE, cache)
        self.pipeline = pipeline
        self.info = BackendInfo(
            kind="in-process", target=target, draft=draft if engine.draft is not None else None,
            accelerator=detect_accelerator(), n_ctx=engine.config.n_ctx, profile=profile,
        )

    @classmethod
    def open(cls, profile: str | None = None, *, cache: CacheTable | None = None,
             on_progress: ProgressFn | None = None, **overrides: Any) -> LocalBackend:
        """Resolve the profile, load its models, the cache and the router, start the step thread.
        `cache` is the [cache] table (None: its defaults); `on_progress` hears the models' load and
        the one-time calibration."""
        from localspec.service import open_pipeline

        pipeline, files = open_pipeline(profile, cache=cache, on_progress=on_progress, **overrides)
        large = pipeline.tiers[pipeline.default_tier]
        return cls(large.engine, profile=profile, target=files.target_id, draft=files.draft_id, pipeline=pipeline)

    def start(self, request: GenerationRequest, route: str | None = None) -> _LocalGeneration:
        # Without a router there is one tier, and every route means it.
        return _LocalGeneration(self.pipeline.submit(request, route=route if self.pipeline.router else None))

    def mark_wrong(self, entry_id: str) -> bool:
        return self.pipeline.mark_wrong(entry_id)

    def opens_thought(self, request: GenerationRequest) -> bool | None:
        """Asked of the default tier's template with the variables it will render with (the model's own
        under the request's); a router's other tier, if it thinks, sends `<think>` itself."""
        try:
            return self.engine.prompter.opens_thought_with(self.engine.with_defaults(request).template_vars)
        except Exception:  # noqa: BLE001 - a view's hint: an answer's own <think> tag still shows the thought
            return None

    def close(self) -> None:
        self.pipeline.close()
        embedder = self.pipeline.cache.embedder if self.pipeline.cache else None
        if embedder is not None:
            embedder.close()


# ---------------------------------------------------------------------- remote


class ServerLost(LocalspecError):
    """The attached server no longer answers as localspec: nothing was sent; load the models here."""


class RemoteBackend:
    """An OpenAI-compatible endpoint; `model` defaults to the first model the server lists.

    `localspec`: the server is localspec, so replies carry token origins and stats (None: ask its
    /health). `profile`: the profile the server runs, when known (shown as the app's). `attached`:
    found on this machine rather than named (--connect); each prompt then goes only to a port that
    still answers as localspec, else `start` raises ServerLost."""

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None,
                 clock: Callable[[], float] = time.perf_counter, *, localspec: bool | None = None,
                 profile: str | None = None, attached: bool = False) -> None:
        base = api_base(url)
        self.client = openai_client(base, api_key=api_key, timeout_s=600)
        self._clock = clock
        if model is None:
            try:
                listed = self.client.models.list()
                model = next(iter(listed)).id
            except Exception as exc:
                raise LocalspecError(
                    f"Could not reach an OpenAI-compatible server at {base}: {remote_error(exc)}.",
                    "Start it with `localspec serve`, or check the --connect URL.",
                ) from exc
        self.model = model
        self._root = base.removesuffix("/v1")
        self._attached = attached
        self.localspec = is_localspec(self._root) if localspec is None else localspec
        pair = self._served_pair(model) if self.localspec else None
        self.info = BackendInfo(kind="remote", target=model, draft=pair.draft if pair else None,
                                accelerator=(pair.processor if pair else None) or "remote",
                                n_ctx=pair.n_ctx if pair else None, url=base, profile=profile,
                                logged_by_server=attached)

    def _served_pair(self, model: str) -> ServedPair | None:
        """The server's draft, context and processor for the pane (None: it does not say)."""
        try:
            return served_pair(self.client.get("/ps", cast_to=object), model)
        except Exception as exc:  # an older server without /v1/ps, or one that went away: figures left out
            logger.info("reading the server's /v1/ps failed: %s", remote_error(exc))
            return None

    def start(self, request: GenerationRequest, route: str | None = None) -> RemoteGeneration:
        if self._attached:
            self._check_server()
        return RemoteGeneration(self.client, "auto" if route == "auto" else self.model, request, self._clock,
                                localspec=self.localspec)

    def _check_server(self) -> None:
        """The attached port still answers /health as localspec, version included: the server may
        have stopped, and another program may listen there now (it would read the chat)."""
        from localspec.attach.probe import NoHealth, ask_health

        found = ask_health(self._root)
        if found is NoHealth.NOTHING:
            raise ServerLost(f"The server at {self._root} no longer answers", None)
        if isinstance(found, NoHealth):
            raise ServerLost(f"{self._root} answers, but not as localspec any more", None)

    def mark_wrong(self, entry_id: str) -> bool:
        """Tell the server a cached answer was wrong (POST /v1/cache/{id}/wrong with the answer's token)."""
        entry, _, token = entry_id.partition(".")
        try:
            self.client.post(f"/cache/{entry}/wrong", cast_to=object, body={"token": token})
            return True
        except Exception as exc:
            logger.warning("marking cache entry %s wrong failed: %s", entry_id, exc)
            return False

    def opens_thought(self, request: GenerationRequest) -> bool | None:
        return None  # the server sends the thought apart, and the reply puts it back in its tags

    def close(self) -> None:
        self.client.close()


def is_localspec(root: str) -> bool:
    """Whether the server answers /health as localspec (then it takes the `localspec` extension)."""
    from localspec.attach.probe import health

    return health(root) is not None


# ---------------------------------------------------------------------- replay


class _ReplayGeneration:
    def __init__(self, events: Sequence[Event], delay: float, cached: bool | None, route: str | None,
                 dropped: int) -> None:
        self._events = events
        self._delay = delay
        self._cancel = threading.Event()
        self.dropped_messages = dropped
        self.cached = cached
        self.cache_entry: str | None = None
        self.route = route

    def __iter__(self) -> Iterator[Event]:
        text: list[str] = []
        for event in self._events:
            if self._cancel.wait(self._delay) if self._delay else self._cancel.is_set():
                yield Done("cancelled", Stats(mode="replay", completion_tokens=len(text)), "".join(text))
                return
            if isinstance(event, Token):
                text.append(event.text)
            yield event
            if isinstance(event, Done):
                return

    def cancel(self) -> None:
        self._cancel.set()


class ReplayBackend:
    """Plays recorded replies in turn (the last one repeats): no model, fixed figures."""

    def __init__(self, replies: Sequence[Sequence[Event]], info: BackendInfo | None = None,
                 delay: float = 0.0, cached: bool | None = None, route: str | None = None,
                 dropped_messages: int = 0) -> None:
        if not replies:
            raise ValueError("need at least one recorded reply")
        self.replies = [list(r) for r in replies]
        self.info = info or BackendInfo(kind="replay", target="recorded", accelerator="CPU", n_ctx=4096)
        self.delay = delay
        self.cached, self.route, self.dropped_messages = cached, route, dropped_messages
        self.requests: queue.SimpleQueue[GenerationRequest] = queue.SimpleQueue()
        self._n = 0

    def start(self, request: GenerationRequest, route: str | None = None) -> _ReplayGeneration:
        self.requests.put(request)
        events = self.replies[min(self._n, len(self.replies) - 1)]
        self._n += 1
        return _ReplayGeneration(events, self.delay, self.cached, self.route, self.dropped_messages)

    def mark_wrong(self, entry_id: str) -> bool:
        return False  # a recording has no cache

    def opens_thought(self, request: GenerationRequest) -> bool | None:
        return self.info.opens_thought

    def close(self) -> None:
        pass
