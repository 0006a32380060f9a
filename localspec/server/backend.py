"""What the endpoint serves: the request pipeline (cache, engine tiers), the model names, the embedder.

Loaded on a background thread after the port opens; `/health` answers 503 until `ready`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from localspec.engine.embedder import Embedder
from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker
from localspec.models.adapters import LoraSpec
from localspec.pipeline import LocalTier, Pipeline
from localspec.server.embeddings import EmbeddingModel
from localspec.server.settings import ServerSettings

logger = logging.getLogger(__name__)

AUTO = "auto"  # the router picks the tier; without a router it is the profile's target


@dataclass
class Backend:
    pipeline: Pipeline
    target_id: str
    target_names: set[str]  # every model name a chat/completion request may use
    draft_id: str | None
    profile: str | None
    routes: dict[str, str] = field(default_factory=dict)  # model name -> the pipeline's route ("auto", a tier)
    embedding_id: str | None = None
    embedding_names: set[str] = field(default_factory=set)
    embedding_path: Path | None = None
    adapter: LoraSpec | None = None  # the LoRA applied to the target (--lora), listed on its names
    _embedder: EmbeddingModel | None = None
    _shared_embedder: Embedder | None = None  # the cache's, reused for /v1/embeddings
    _embed_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tier(self) -> LocalTier:
        """The default tier: the engine in this process that the endpoint's model names mean."""
        tier = self.pipeline.tiers[self.pipeline.default_tier]
        if not isinstance(tier, LocalTier):
            raise TypeError(f"the default tier {tier.name} is not in this process")
        return tier

    @property
    def engine(self) -> Engine:
        return self.tier.engine

    @property
    def worker(self) -> EngineWorker:
        return self.tier.worker

    def route_for(self, name: str) -> str | None:
        """The pipeline route a requested model name means (None: the default tier)."""
        return self.routes.get(name)

    def model_behind(self, name: str) -> str:
        """The model that answers a name: a tier's model, or "router" for auto."""
        route = self.route_for(name)
        if route == AUTO:
            return "router"
        if route and self.pipeline.router is not None:
            spec = self.pipeline.router.tier(route)
            return spec.target or spec.model or route
        return self.target_id

    @classmethod
    def load(cls, s: ServerSettings) -> Backend:
        from localspec.models import ModelManager
        from localspec.service import open_pipeline
        from localspec.settings import CacheTable

        cache = CacheTable(enabled=s.cache, semantic=s.cache_semantic, sampled=s.cache_sampled, judge=s.cache_judge)
        pipeline, files = open_pipeline(
            profile=s.profile, target=s.target, draft=s.draft, cache=cache, route=s.router,
            parallel=s.parallel, n_ctx=s.n_ctx, n_threads=s.n_threads, mode=s.mode,
            lora_path=s.lora_path, lora_scale=s.lora_scale if s.lora_path else None,
        )
        mm = ModelManager()
        prof_name = s.profile or mm.registry.default_profile
        prof = mm.profile(s.profile)
        routes: dict[str, str] = {}
        if pipeline.router is not None:
            routes[AUTO] = AUTO
            for spec in pipeline.router.tiers:
                if spec.kind == "local":
                    for n in (spec.target, *mm.resolve(spec.target).aliases):
                        routes.setdefault(n, spec.name)
                elif spec.model:
                    routes.setdefault(spec.model, spec.name)
        names = {files.target_id, *mm.resolve(files.target_id).aliases, AUTO, *routes}
        for n in (files.target_id, *mm.resolve(files.target_id).aliases):
            routes[n] = "large"  # the target names always mean the large tier, even if small shares an alias
        emb_id = emb_path = None
        if prof.embedding and s.embeddings:
            emb_id = mm.resolve(prof.embedding).id
            emb_path = mm.installed_path(emb_id)
            emb_id = emb_id if emb_path else None
        emb_names = {emb_id, *mm.resolve(emb_id).aliases} if emb_id else set()
        return cls(
            pipeline=pipeline, target_id=files.target_id, target_names=names, draft_id=files.draft_id,
            profile=prof_name, routes=routes, embedding_id=emb_id, embedding_names=emb_names,
            embedding_path=emb_path, _shared_embedder=pipeline.cache.embedder if pipeline.cache else None,
            adapter=_adapter(pipeline),
        )

    def embedder(self) -> EmbeddingModel | None:
        """Loaded on first use (most clients never ask for embeddings), or the cache's when it has one."""
        if self.embedding_path is None:
            return None
        with self._embed_lock:
            if self._embedder is None:
                self._embedder = EmbeddingModel(
                    self.embedding_path, self.engine.config.n_threads, embedder=self._shared_embedder,
                )
            return self._embedder

    def close(self, drain: bool = False) -> None:
        self.pipeline.close(drain=drain)
        if self._embedder is not None:
            self._embedder.close()
        elif self._shared_embedder is not None:
            self._shared_embedder.close()


def _adapter(pipeline: Pipeline) -> LoraSpec | None:
    """The LoRA the default tier's engine applies, as it was loaded."""
    tier = pipeline.tiers[pipeline.default_tier]
    config = tier.engine.config if isinstance(tier, LocalTier) else None
    return LoraSpec(Path(config.lora_path), config.lora_scale) if config and config.lora_path else None


@dataclass(frozen=True)
class Catalog:
    """What the server answers to, kept while its models are unloaded (keep-alive, `stop`), so that
    /v1/models and a request's model check need no load."""

    target_id: str
    draft_id: str | None
    profile: str | None
    names: dict[str, tuple[str, str]]  # chat name -> (the model behind it, its route)
    embedding_id: str | None
    embedding_names: frozenset[str]
    adapter: str | None = None  # the target's LoRA as listed: file name and scale (LoraSpec.label)

    @classmethod
    def of(cls, b: Backend) -> Catalog:
        from localspec.router import TierName

        names = {n: (b.model_behind(n), b.route_for(n) or str(TierName.LARGE)) for n in b.target_names}
        return cls(b.target_id, b.draft_id, b.profile, names, b.embedding_id, frozenset(b.embedding_names),
                   b.adapter.label if b.adapter else None)


class Loader:
    """Loads the backend on a thread, and again on demand after an unload; the app reads `state` and `backend`."""

    def __init__(self, settings: ServerSettings, load: Callable[[ServerSettings], Backend] | None = None) -> None:
        self.settings = settings
        self._load = load or Backend.load
        self.backend: Backend | None = None
        self.catalog: Catalog | None = None
        self.error: str | None = None
        self.failed_at: float | None = None  # monotonic time of the last failed load
        self.loads = 0  # loads started: past the first, a request waits for one instead of getting a 503
        self.on_ready: Callable[[Backend], None] | None = None  # hears the backend once it is loaded
        self._loading = threading.Event()
        self._lock = threading.Lock()
        self._closed = False

    def sibling(self, settings: ServerSettings) -> Loader:
        """A loader for other models (one a request named), loading the same way and heard the same way."""
        other = Loader(settings, self._load)
        other.on_ready = self.on_ready
        return other

    def start(self) -> None:
        """Load on a thread, unless loaded or loading already."""
        with self._lock:
            if self.backend is not None or self._loading.is_set() or self._closed:
                return
            self._loading.set()
            self.error = None
            self.loads += 1
        threading.Thread(target=self._run, name="localspec-load", daemon=True).start()

    def _run(self) -> None:
        try:
            backend = self._load(self.settings)
        except Exception as exc:  # shown on /health and in the log; the server keeps answering
            logger.exception("loading the models failed")
            self.error = str(exc)
            self.failed_at = time.monotonic()
            self._loading.clear()
            return
        if self._closed:
            backend.close()
            self._loading.clear()
            return
        if self.on_ready is not None:
            self.on_ready(backend)
        if isinstance(backend, Backend):  # tests of the routes alone load something else
            self.catalog = Catalog.of(backend)
        self.backend = backend
        self._loading.clear()

    def may_retry(self, interval_s: float) -> bool:
        """Whether a failed load may be tried again: once `interval_s` has passed since it failed."""
        return self.failed_at is None or time.monotonic() - self.failed_at >= interval_s

    @property
    def loading(self) -> bool:
        return self._loading.is_set()

    @property
    def state(self) -> Literal["ok", "loading", "error", "idle"]:
        """ok, loading, error, or idle: unloaded after its keep-alive (or `stop`), loaded again on demand."""
        if self.backend is not None:
            return "ok"
        if self.loading:
            return "loading"
        return "error" if self.error else "idle" if self.loads else "loading"

    def detach(self) -> Backend | None:
        """Take the loaded models out of service (the next request loads them again); the caller closes
        them, off the event loop. Requests still running on them are cancelled by that close."""
        with self._lock:
            backend, self.backend = self.backend, None
        if backend is not None:
            logger.info("models unloaded; the next request loads them again")
        return backend

    def close(self, drain: bool = True) -> None:
        self._closed = True
        if self.backend is not None:
            self.backend.close(drain=drain)
            self.backend = None
