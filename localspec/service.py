"""The request pipeline every face shares (CLI, endpoint, TUI).

It resolves a profile to model files, checks them, and opens the engine and the cache; the
per-request stages (route, cache lookup, generate, cache store) live in `localspec.pipeline`,
which the endpoint and the TUI both drive, so a feature added there appears in every face.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from localspec.cache import SemanticCache
from localspec.cache.judge import DEFAULT_JUDGE_THRESHOLD, ModelJudge
from localspec.engine.config import EngineConfig
from localspec.engine.embedder import Embedder
from localspec.engine.events import ProgressFn
from localspec.engine.offload import ALL_LAYERS, OffloadPlanner
from localspec.engine.scheduler import Engine
from localspec.errors import ConfigError, LocalspecError, UsageError
from localspec.models import ModelManager
from localspec.models.compat import check_draft_compat, check_lora
from localspec.models.gguf_info import validate_gguf
from localspec.models.model_settings import target_settings
from localspec.models.registry import ModelSettings
from localspec.paths import resolve_paths
from localspec.settings import CacheTable

logger = logging.getLogger(__name__)


def load_settings(path: Path | None = None) -> dict[str, Any]:
    """The [engine] keys that settings.toml or the environment set: a view of the one settings model."""
    from localspec.settings import load_settings as load_all

    return load_all(path).engine_values()


def engine_config(profile_n_ctx: int | None = None, *, model_n_ctx: int | None = None,
                  **overrides: Any) -> EngineConfig:
    """Defaults < profile < settings.toml < environment < the target's own settings (its registry
    entry's n_ctx) < explicit overrides (CLI flags, API arguments)."""
    values: dict[str, Any] = {}
    if profile_n_ctx:
        values["n_ctx"] = profile_n_ctx
    values.update(load_settings())
    if model_n_ctx:
        values["n_ctx"] = model_n_ctx
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return EngineConfig(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        if overrides.get(field) is not None:  # a flag's value: a usage error naming the flag, as --max-tokens 0 is
            flag = _FLAGS.get(field, f"--{field.replace('_', '-')}")
            raise UsageError(f"Invalid {flag} {overrides[field]}: {err['msg']}.",
                             "See the command's --help for the values it takes.") from exc
        raise ConfigError(f"Engine setting '{field}': {err['msg']}.",
                          "Correct it in settings.toml (or the model's or profile's entry in models.toml).") from exc


_FLAGS = {"n_threads": "--threads"}  # EngineConfig fields whose flag is not the field's name


@dataclass(frozen=True)
class ModelFiles:
    target: Path
    draft: Path | None
    target_id: str
    draft_id: str | None
    target_settings: ModelSettings | None = None  # the target entry's [models.settings]


def resolve_models(
    profile: str | None = None, target: str | None = None, draft: str | None = None, need_draft: bool = True
) -> tuple[ModelFiles, int]:
    """Profile (or explicit ids) to checked files on disk; returns the files and the profile's n_ctx.

    A target named without a draft (any installed model, one pulled from the Hub included) gets the
    draft that pairing finds for it (the profile's when its tokenizer matches), or none: `auto` then
    speculates with prompt lookup and prediction."""
    mm = ModelManager()
    prof = mm.profile(profile)
    target_id = mm.resolve(target or prof.target).id
    target_path = mm.require_path(target_id)
    validate_gguf(target_path)
    draft_id = draft or prof.draft
    if need_draft and draft is None and target_id != prof.target:
        pairing = mm.pair_draft(target_id, profile)
        logger.info("%s", pairing.summary)
        draft_id = pairing.draft_id
    draft_path = None
    if need_draft and draft_id:
        draft_id = mm.resolve(draft_id).id
        draft_path = mm.require_path(draft_id)
        validate_gguf(draft_path)
        check_draft_compat(target_path, draft_path)  # refuses a mismatched tokenizer, naming what differs
    entry = mm.registry.models.get(target_id)  # None for a model only in the store (imported)
    return ModelFiles(target_path, draft_path, target_id, draft_id if draft_path else None,
                      entry.settings if entry else None), prof.n_ctx


def calibration_dir() -> str:
    """Where measured speculative costs are cached; LOCALSPEC_CALIBRATION_DIR overrides (tests share one)."""
    return os.environ.get("LOCALSPEC_CALIBRATION_DIR") or str(resolve_paths().cache_dir)


def _wants_draft(overrides: dict[str, Any]) -> bool:
    """Whether the mode the engine will run (the caller's, else settings.toml's) uses a draft model."""
    mode = overrides.get("mode") or load_settings().get("mode")
    return mode not in ("off", "lookup")


def open_engine(
    profile: str | None = None, target: str | None = None, draft: str | None = None, *,
    on_progress: ProgressFn | None = None, **overrides: Any,
) -> Engine:
    """Load the engine for a profile. `overrides` are EngineConfig fields (None = keep); `on_progress`
    hears the models' load and the one-time calibration (a face shows it)."""
    files, n_ctx = resolve_models(profile, target, draft, need_draft=_wants_draft(overrides))
    own = target_settings(files.target_id, files.target_settings)
    config = engine_config(n_ctx, model_n_ctx=own.n_ctx, **overrides)
    bound = None if config.lora_path else ModelManager().lora(files.target_id)
    if bound is not None:  # the adapter models.toml binds to this target, unless --lora or settings name one
        config = config.model_copy(update={"lora_path": str(bound.path), "lora_scale": bound.scale})
    if config.lora_path:
        check_lora(config.lora_path, files.target)  # a wrong adapter is a clean error before llama.cpp sees it
    if files.draft is None and config.mode == "draft":
        config = config.model_copy(update={"mode": "lookup"})
    return Engine.load(
        str(files.target), str(files.draft) if files.draft else None, config,
        calibration_dir=calibration_dir(), on_progress=on_progress, offload=offload_planner(config),
        defaults=own.defaults, chat_template=own.chat_template,
    )


def offload_planner(config: EngineConfig) -> OffloadPlanner | None:
    """Splits layers by free VRAM when n_gpu_layers is -1 on a GPU build; None leaves it as configured."""
    from localspec.engine.runtime import gpu_offload_supported
    from localspec.models.fit import vram_planner

    if config.n_gpu_layers != ALL_LAYERS:
        return None
    return vram_planner(offload_supported=gpu_offload_supported())


def tier_fingerprint(path: Path, engine: Engine) -> str:
    """The cache's identity of a local tier: its model file with its adapter, and the chat template
    file its settings put in place of the GGUF's (another template, other answers)."""
    fingerprint = answer_fingerprint(path, engine.config.lora_path, engine.config.lora_scale)
    template = engine.prompter.template
    if template is not None and template != engine.target.chat_template:
        fingerprint += "+template:" + hashlib.sha256(template.encode()).hexdigest()[:16]
    return fingerprint


def open_judge(profile: str | None = None, model: str | None = None, threshold: float | None = None,
               n_threads: int | None = None) -> tuple[ModelJudge, Callable[[], None]]:
    """A reuse judge on its own engine (the profile's target unless `model` names another), for
    `localspec cache eval`; the faces judge with the answering tier's engine instead. Returns the
    judge and the function that unloads it."""
    from localspec.engine.worker import EngineWorker

    engine = open_engine(profile, target=model, mode="off", n_ctx=1024, n_threads=n_threads)
    worker = EngineWorker(engine).start()
    judge = ModelJudge(worker.submit, lambda w: engine.target.tokenize(w, add_special=False),
                       DEFAULT_JUDGE_THRESHOLD if threshold is None else threshold, name=engine.target.path.name)
    judge.warm(wait=True)  # the shared examples' prefill, so that no timed judgement pays it

    def close() -> None:
        worker.stop()
        engine.close()

    return judge, close


def open_embedder(path: Path, n_threads: int | None = None) -> Embedder:
    """An embedding model, its file checked first: a bad file is a clean error, never a llama.cpp abort."""
    validate_gguf(path)
    return Embedder(path, n_threads=n_threads or 2)


def open_cache(profile: str | None = None, n_threads: int | None = None,
               embedding_path: Path | None = None, semantic: bool = False) -> SemanticCache:
    """The cache: exact-match by default; with `semantic`, near-duplicates match through the profile's
    embedding model and the false-hit guard.

    Semantic matching is opt-in because on the blind test pairs it still serves 2.3% of traps with
    the reuse judge (6.3% without); see `localspec cache eval` and docs/semantic-cache.md. A broken
    or missing embedding model degrades the cache to exact matching (it says so in `describe()`),
    never the face that opened it.
    """
    if not semantic:
        cache = SemanticCache(embedder=None)
        cache.exact_reason = "semantic matching is off (enable it with --cache-semantic)"
        return cache
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
            embedder = open_embedder(embedding_path, n_threads)
        except Exception as exc:
            logger.warning("embedding model %s unusable, cache in exact-match mode: %s", embedding_path, exc)
    cache = SemanticCache(embedder=embedder)
    logger.info("cache: %s", cache.describe())
    return cache


def answer_fingerprint(target: Path, lora_path: str | None, lora_scale: float) -> str:
    """Whose answers the cache holds: the target file's identity, and its adapter's and scale when
    one is applied (an adapter changes the answers, so they must not be served without it)."""
    from localspec.engine.embedder import file_fingerprint

    base = file_fingerprint(target)
    if not lora_path:
        return base
    return hashlib.sha256(f"{base}|{file_fingerprint(lora_path)}|{lora_scale!r}".encode()).hexdigest()[:32]


def open_pipeline(
    profile: str | None = None, target: str | None = None, draft: str | None = None, *,
    cache: CacheTable | None = None, route: bool = True, on_progress: ProgressFn | None = None, **overrides: Any,
):
    """The shared request pipeline for a profile: the large tier loaded now, the cache, the router.

    `cache` is the [cache] table each face resolved (settings under its flags); None means its
    defaults. `on_progress` hears the large tier's load and calibration; the small tier loads later, quietly.

    The router's tiers are checked now (a missing model names its pull command, a bad remote URL
    or unset key fails here, not at the first request); the small tier loads on its first request.
    Explicit `target`/`draft` ids serve that pair alone, without a router.
    """
    from localspec.pipeline import LocalTier, Pipeline, PipelineSettings, RemoteRunner
    from localspec.router import RemoteTier, Router, TierName

    cache = cache if cache is not None else CacheTable()
    files, _ = resolve_models(profile, target, draft, need_draft=_wants_draft(overrides))
    engine = open_engine(profile, target, draft, on_progress=on_progress, **overrides)
    large = LocalTier(TierName.LARGE, engine, files.target_id, files.draft_id, tier_fingerprint(files.target, engine))
    semantic = open_cache(profile, engine.config.n_threads, semantic=cache.semantic) if cache.enabled else None
    router = None
    if route and target is None:
        router = Router.from_profile(profile, embedder=semantic.embedder if semantic else None)
        if len(router.tiers) < 2:
            router = None

    def load_tier(name: TierName) -> LocalTier | RemoteRunner:
        spec = router.tier(name) if router else None
        if spec is None:
            raise KeyError(name)
        if spec.kind == "remote":
            return RemoteRunner(RemoteTier(spec))
        small_files, _ = resolve_models(profile, spec.target, None, need_draft=False)
        small_overrides = {k: v for k, v in overrides.items() if k in ("n_ctx", "n_threads", "parallel")}
        small = open_engine(profile, spec.target, None, mode="off", **small_overrides)
        return LocalTier(name, small, small_files.target_id, None, tier_fingerprint(small_files.target, small))

    settings = PipelineSettings(cache=cache.enabled, cache_sampled=cache.sampled, cache_judge=cache.judge)
    pipeline = Pipeline({TierName.LARGE: large}, TierName.LARGE, semantic, settings, router=router,
                        load_tier=load_tier if router else None)
    if router is not None:
        for spec in router.tiers:
            if spec.kind == "remote":
                pipeline.tiers[spec.name] = RemoteRunner(RemoteTier(spec))
    return pipeline, files
