"""What the endpoint serves: the engine on its worker thread, the model names, the embedder.

Loaded on a background thread after the port opens; `/health` answers 503 until `ready`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker
from localspec.server.embeddings import EmbeddingModel
from localspec.server.settings import ServerSettings

logger = logging.getLogger(__name__)

AUTO = "auto"  # the router's name; until the router lands it means the profile's target


@dataclass
class Backend:
    engine: Engine
    worker: EngineWorker
    target_id: str
    target_names: set[str]
    draft_id: str | None
    profile: str
    embedding_id: str | None = None
    embedding_names: set[str] = field(default_factory=set)
    embedding_path: Path | None = None
    _embedder: EmbeddingModel | None = None
    _embed_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, s: ServerSettings) -> Backend:
        from localspec.models import ModelManager
        from localspec.service import open_served

        served = open_served(
            profile=s.profile, target=s.target, draft=s.draft,
            parallel=s.parallel, n_ctx=s.n_ctx, n_threads=s.n_threads, mode=s.mode,
        )
        mm = ModelManager()
        names = {served.files.target_id, *mm.resolve(served.files.target_id).aliases, AUTO}
        emb_names: set[str] = set()
        if served.embedding_id:
            emb_names = {served.embedding_id, *mm.resolve(served.embedding_id).aliases}
        worker = EngineWorker(served.engine).start()
        return cls(
            engine=served.engine, worker=worker, target_id=served.files.target_id, target_names=names,
            draft_id=served.files.draft_id, profile=served.profile,
            embedding_id=served.embedding_id if s.embeddings else None,
            embedding_names=emb_names if s.embeddings else set(),
            embedding_path=served.embedding_path if s.embeddings else None,
        )

    def embedder(self) -> EmbeddingModel | None:
        """Loaded on first use: most clients never ask for embeddings."""
        if self.embedding_path is None:
            return None
        with self._embed_lock:
            if self._embedder is None:
                self._embedder = EmbeddingModel(self.embedding_path, self.engine.config.n_threads)
            return self._embedder

    def close(self, drain: bool = False) -> None:
        self.worker.stop(drain=drain)
        if self._embedder is not None:
            self._embedder.close()
        self.engine.close()


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
