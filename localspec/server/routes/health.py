"""GET /health (200 once the models are loaded) and GET /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from localspec import __version__
from localspec.server.redact import redact_paths
from localspec.server.schemas import Health
from localspec.server.state import State

router = APIRouter()


@router.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Loading"}})
async def health(state: State) -> JSONResponse:
    loader = state.loader
    body = Health(status=loader.state, detail=redact_paths(loader.error) if loader.error else None,
                  version=__version__)
    # idle: unloaded after its keep-alive, and ready to load on the next request: a healthy server.
    return JSONResponse(body.model_dump(exclude_none=True), 200 if loader.state in ("ok", "idle") else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus(state: State) -> Response:
    state.metrics.set_queue_depth(state.queue_depth())
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
