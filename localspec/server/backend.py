"""What the endpoint serves: the request pipeline (cache, engine tiers), the model names, the embedder.

Loaded on a background thread after the port opens; `/health` answers 503 until `ready`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.embedder import Embedder, file_fingerprint
from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker
from localspec.pipeline import LocalTier, Pipeline, PipelineSettings
from localspec.server.embeddings import EmbeddingModel
from localspec.server.settings import ServerSettings

logger = logging.getLogger(__name__)

AUTO = "auto"  # the router's name; until the router lands it means the profile's target


@dataclass
class Backend:
    pipeline: Pipeline
    target_id: str
    target_names: set[str]
    draft_id: str | None
    profile: str
    embedding_id: str | None = None
    embedding_names: set[str] = field(default_factory=set)
    embedding_path: Path | None = None
    _embedder: EmbeddingModel | None = None
    _shared_embedder: Embedder | None = None  # the cache's, reused for /v1/embeddings
    _embed_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tier(self) -> LocalTier:
        return self.pipeline.tiers[self.pipeline.default_tier]

    @property
    def engine(self) -> Engine:
        return self.tier.engine

    @property
    def worker(self) -> EngineWorker:
        return self.tier.worker

    @classmethod
    def load(cls, s: ServerSettings) -> Backend:
        from localspec.models import ModelManager
        from localspec.service import open_cache, open_served

        served = open_served(
            profile=s.profile, target=s.target, draft=s.draft,
            parallel=s.parallel, n_ctx=s.n_ctx, n_threads=s.n_threads, mode=s.mode,
        )
        mm = ModelManager()
        names = {served.files.target_id, *mm.resolve(served.files.target_id).aliases, AUTO}
        emb_names: set[str] = set()
        if served.embedding_id:
            emb_names = {served.embedding_id, *mm.resolve(served.embedding_id).aliases}
        cache = embedder = None
        if s.cache:
            cache = open_cache(served.profile, served.engine.config.n_threads, served.embedding_path)
            embedder = cache.embedder
        tier = LocalTier("large", served.engine, served.files.target_id, served.files.draft_id,
                         file_fingerprint(served.files.target))
        pipeline = Pipeline({"large": tier}, "large", cache,
                            PipelineSettings(cache=s.cache, cache_sampled=s.cache_sampled))
        return cls(
            pipeline=pipeline, target_id=served.files.target_id, target_names=names,
            draft_id=served.files.draft_id, profile=served.profile,
            embedding_id=served.embedding_id if s.embeddings else None,
            embedding_names=emb_names if s.embeddings else set(),
            embedding_path=served.embedding_path if s.embeddings else None,
            _shared_embedder=embedder,
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


class Loader:
    """Loads the backend on a thread; the app reads `state` and `backend`."""

    def __init__(self, settings: ServerSettings, load: Callable[[ServerSettings], Backend] | None = None) -> None:
        self.settings = settings
        self._load = load or Backend.load
        self.backend: Backend | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="localspec-load", daemon=True)
        self._closed = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            backend = self._load(self.settings)
        except Exception as exc:  # shown on /health and in the log; the server keeps answering
            logger.exception("loading the models failed")
            self.error = str(exc)
            return
        if self._closed:
            backend.close()
            return
        self.backend = backend

    @property
    def state(self) -> str:
        return "ok" if self.backend else "error" if self.error else "loading"

    def close(self, drain: bool = True) -> None:
        self._closed = True
        if self.backend is not None:
            self.backend.close(drain=drain)
            self.backend = None
