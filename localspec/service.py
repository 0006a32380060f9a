"""The request pipeline every face shares (CLI, endpoint, TUI).

It resolves a profile to model files, checks them, and opens the engine and the cache; the
per-request stages (route, cache lookup, generate, cache store) live in `localspec.pipeline`,
which the endpoint and the TUI both drive, so a feature added there appears in every face.
"""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from localspec.cache import SemanticCache
from localspec.engine.config import EngineConfig
from localspec.engine.embedder import Embedder
from localspec.engine.scheduler import Engine
from localspec.errors import ConfigError, LocalspecError
from localspec.models import ModelManager
from localspec.models.compat import check_draft_compat
from localspec.models.gguf_info import validate_gguf
from localspec.paths import resolve_paths

logger = logging.getLogger(__name__)


def load_settings(path: Path | None = None) -> dict[str, Any]:
    """The user's settings.toml: an [engine] table whose keys are EngineConfig fields."""
    path = path or resolve_paths().settings_file
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}.", "Fix the TOML syntax or delete the file.") from exc
    return data.get("engine", {})


def engine_config(profile_n_ctx: int | None = None, **overrides: Any) -> EngineConfig:
    """Defaults < profile < settings.toml < explicit overrides (CLI flags, API arguments)."""
    values: dict[str, Any] = {}
    if profile_n_ctx:
        values["n_ctx"] = profile_n_ctx
    values.update(load_settings())
    if os.environ.get("LOCALSPEC_THREADS"):
        values["n_threads"] = int(os.environ["LOCALSPEC_THREADS"])
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return EngineConfig(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"Engine setting '{field}': {err['msg']}.", "Correct the flag or settings.toml.") from exc


@dataclass(frozen=True)
class ModelFiles:
    target: Path
    draft: Path | None
    target_id: str
    draft_id: str | None


def resolve_models(
    profile: str | None = None, target: str | None = None, draft: str | None = None, need_draft: bool = True
) -> tuple[ModelFiles, int]:
    """Profile (or explicit ids) to checked files on disk; returns the files and the profile's n_ctx."""
    mm = ModelManager()
    prof = mm.profile(profile)
    target_id = mm.resolve(target or prof.target).id
    target_path = mm.require_path(target_id)
    validate_gguf(target_path)
    draft_id = draft or prof.draft
    draft_path = None
    if need_draft and draft_id:
        draft_id = mm.resolve(draft_id).id
        draft_path = mm.require_path(draft_id)
        validate_gguf(draft_path)
        check_draft_compat(target_path, draft_path)  # refuses a mismatched tokenizer, naming what differs
    return ModelFiles(target_path, draft_path, target_id, draft_id if draft_path else None), prof.n_ctx


def calibration_dir() -> str:
    """Where measured speculative costs are cached; LOCALSPEC_CALIBRATION_DIR overrides (tests share one)."""
    return os.environ.get("LOCALSPEC_CALIBRATION_DIR") or str(resolve_paths().cache_dir)


def open_engine(
    profile: str | None = None, target: str | None = None, draft: str | None = None, **overrides: Any
) -> Engine:
    """Load the engine for a profile. `overrides` are EngineConfig fields (None = keep)."""
    mode = overrides.get("mode")
    files, n_ctx = resolve_models(profile, target, draft, need_draft=mode != "off" and mode != "lookup")
    config = engine_config(n_ctx, **overrides)
    if files.draft is None and config.mode == "draft":
        config = config.model_copy(update={"mode": "lookup"})
    return Engine.load(
        str(files.target), str(files.draft) if files.draft else None, config,
        calibration_dir=calibration_dir(),
    )


@dataclass
class Served:
    """What a long-running face (the HTTP endpoint) serves: the engine and the names behind it."""

    engine: Engine
    files: ModelFiles
    profile: str
    embedding_id: str | None  # None when the profile has none or it is not installed
    embedding_path: Path | None


def open_served(
    profile: str | None = None, target: str | None = None, draft: str | None = None, **overrides: Any
) -> Served:
    """`open_engine` plus the ids and the embedding model the endpoint advertises."""
    mm = ModelManager()
    prof_name = profile or mm.registry.default_profile
    prof = mm.profile(profile)
    mode = overrides.get("mode")
    files, _ = resolve_models(profile, target, draft, need_draft=mode != "off" and mode != "lookup")
    engine = open_engine(profile, target, draft, **overrides)
    emb_id = emb_path = None
    if prof.embedding:
        emb_id = mm.resolve(prof.embedding).id
        emb_path = mm.installed_path(emb_id)
        if emb_path is None:
            emb_id = None
    return Served(engine, files, prof_name, emb_id, emb_path)


def open_cache(profile: str | None = None, n_threads: int | None = None,
               embedding_path: Path | None = None) -> SemanticCache:
    """The semantic cache with the profile's embedding model, or in exact-match mode without one.

    A broken or missing embedding model degrades the cache (it says so in `describe()`), never the
    face that opened it.
    """
    if embedding_path is None:
        mm = ModelManager()
        prof = mm.profile(profile)
        if prof.embedding:
            try:
                embedding_path = mm.installed_path(mm.resolve(prof.embedding).id)
            except LocalspecError:
                embedding_path = None
    embedder = None
    if embedding_path is not None:
        try:
            validate_gguf(embedding_path)
            embedder = Embedder(embedding_path, n_threads=n_threads or 2)
        except Exception as exc:
            logger.warning("embedding model %s unusable, cache in exact-match mode: %s", embedding_path, exc)
    cache = SemanticCache(embedder=embedder)
    logger.info("cache: %s", cache.describe())
    return cache
