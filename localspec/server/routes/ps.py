"""GET /v1/ps (what is loaded, like `ollama ps`) and POST /v1/stop (unload now, like `ollama stop`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from localspec.engine.offload import OffloadPlan
from localspec.engine.runtime import ModelRuntime
from localspec.engine.scheduler import Engine
from localspec.pipeline import LocalTier
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.routes.models import catalog
from localspec.server.schemas import PsModel, PsReport, StopReply, StopRequest
from localspec.server.state import State, check_model

router = APIRouter()


@router.get("/v1/ps", response_model=PsReport, responses=ERROR_RESPONSES)
async def ps(state: State) -> PsReport:
    loader = state.loader
    ka = state.keep_alive
    report = PsReport(status=loader.state, profile=loader.catalog.profile if loader.catalog else None,
                      keep_alive_s=ka.current, rss_bytes=_rss())
    for r in state.residents():
        b = r.loader.backend
        if b is None:
            continue
        until = dict(keep_alive_s=r.keep_alive.current, on_demand=r is not state.primary,
                     expires_at=None if r.busy() else r.keep_alive.expires_at())
        report.models += [m.model_copy(update=until) for tier in b.pipeline.tiers.values()
                          if isinstance(tier, LocalTier) for m in _models(tier)]
        if b.embedding_id and b._embedder is not None:
            report.models.append(PsModel(name=b.embedding_id, role="embedding", size_bytes=_size(b.embedding_path),
                                         processor="CPU", **until))
    report.loading = [r.key for r in state.extra.values() if r.loader.loading]
    if report.models:
        report.running = state.admission.unfinished()
        report.queue = state.queue_depth()
    if loader.backend is not None:
        report.expires_at = None if state.busy() else ka.expires_at()
    return report


@router.post("/v1/stop", response_model=StopReply, responses=ERROR_RESPONSES)
async def stop(body: StopRequest, state: State) -> StopReply:
    """Unload the models behind a served name now (requests running on them are cancelled); the next
    request naming them loads them again. The profile's models unload together; a model loaded on
    demand unloads alone."""
    r = state.resident_named(body.model)
    if r is None:
        c = catalog(state)
        names = set(c.names) | set(c.embedding_names) | state.served_names()
        if await asyncio.to_thread(state.models.find, body.model) is None:
            check_model(body.model, names)
        return StopReply(model=body.model, unloaded=False)  # installed, never loaded
    return StopReply(model=body.model, unloaded=await state.unload(r))


def _models(tier: LocalTier) -> list[PsModel]:
    engine = tier.engine
    busy = sum(slot.active is not None for slot in engine.slots)
    common = dict(tier=str(tier.name), n_ctx=engine.config.n_ctx, slots=len(engine.slots), slots_busy=busy)
    out = [PsModel(name=tier.model_id, role="target", size_bytes=_size(engine.target.path),
                   processor=_processor(engine, engine.target), **common)]
    if engine.draft is not None:
        out.append(PsModel(name=tier.draft_id or engine.draft.path.stem, role="draft",
                           size_bytes=_size(engine.draft.path), processor=_processor(engine, engine.draft), **common))
    return out


def _processor(engine: Engine, runtime: ModelRuntime) -> str:
    try:
        import llama_cpp

        gpu = bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # a broken build shows in generation, not here
        gpu = False
    return processor_split(gpu=gpu, n_gpu_layers=engine.config.n_gpu_layers, plan=runtime.offload)


def processor_split(*, gpu: bool, n_gpu_layers: int, plan: OffloadPlan | None) -> str:
    """Where a model runs, as `ollama ps` says it: "100% CPU", "100% GPU" or "35%/65% CPU/GPU" (by
    bytes, from the load's offload plan; without one, the configured layers)."""
    if not gpu or n_gpu_layers == 0:
        return "100% CPU"
    if plan is None:
        return "100% GPU" if n_gpu_layers < 0 else f"GPU ({n_gpu_layers} layers) + CPU"
    if plan.offloaded >= plan.n_layers:
        return "100% GPU"
    on_gpu = round(100 * plan.gpu_bytes / plan.total_bytes) if plan.total_bytes > 0 else 0
    return "100% CPU" if on_gpu <= 0 else f"{100 - on_gpu}%/{on_gpu}% CPU/GPU"


def _size(path: object) -> int:
    from pathlib import Path

    try:
        return Path(str(path)).stat().st_size
    except OSError:
        return 0


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)



