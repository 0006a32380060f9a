"""The FastAPI app: OpenAI-compatible routes (localspec.server.routes) over the request pipeline.

Requests are admitted while fewer than `parallel + max_queue` are unfinished (else 429), submitted
to the pipeline, and their events awaited from the job (localspec.server.streaming). A client that
goes away cancels its request, which frees its slot at the engine's next step, queued or decoding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_client import CollectorRegistry

from localspec import __version__
from localspec.server.backend import Backend, Loader
from localspec.server.errors import install as install_errors
from localspec.server.guards import Allowed, Auth, BodyLimit, HostGuard, loopback_origin_regex
from localspec.server.keepalive import KeepAlive, parse_keep_alive
from localspec.server.request_ids import RequestId
from localspec.server.model_store import ManagerStore, ModelStore, NoStore
from localspec.server.residents import InstalledModels, MemoryProbe, ModelSource, NoModels, system_memory
from localspec.server.routes import ROUTERS
from localspec.server.routes.ollama import JsonBodies
from localspec.server.settings import ServerSettings
from localspec.server.state import Admission, ServerState

logger = logging.getLogger(__name__)
REAP_EVERY_S = 0.25  # how often idle models are checked against their keep-alive


def create_app(settings: ServerSettings | None = None, load: Callable[[ServerSettings], Backend] | None = None,
               metrics: Any | None = None, *, models: ModelSource | None = None, store: ModelStore | None = None,
               memory: MemoryProbe = system_memory) -> FastAPI:
    """The ASGI app. `load` builds the backend (default: the profile's models); it runs on a thread.
    `models`: the installed models a request may load on demand (default: the store's with the real
    `load`, none with another); `store`: what /api/pull and /api/delete manage (likewise);
    `memory`: the RAM figures that decide what must unload first."""
    s = settings or ServerSettings()
    if metrics is None:
        from localspec.metrics import Metrics

        metrics = Metrics.from_settings(registry=CollectorRegistry())
    if models is None:
        models = InstalledModels(s.n_ctx, s.parallel, s.profile) if load is None else NoModels()
    if store is None:
        store = ManagerStore() if load is None else NoStore()
    state = ServerState(s, Loader(s, load), Admission(s.parallel + s.max_queue, s.retry_after_s), metrics,
                        KeepAlive(parse_keep_alive(s.keep_alive)), models=models, store=store, memory=memory)
    state.loader.on_ready = state.attach

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.loader.start()
        reaper = asyncio.create_task(reap(state))
        yield
        reaper.cancel()
        # uvicorn has already let running requests finish (its graceful timeout); cancel the rest.
        await asyncio.to_thread(state.close, False)
        state.metrics.close()

    app = FastAPI(title="localspec", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible local inference with lossless speculative decoding.")
    app.state.server = state
    app.state.loader, app.state.admission, app.state.metrics = state.loader, state.admission, state.metrics
    install_errors(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(JsonBodies)  # innermost: Ollama's routes read a body of any Content-Type
    install_guards(app, s)
    return app


async def reap(state: ServerState) -> None:
    """Unload the models once idle past their keep-alive (see localspec.server.keepalive)."""
    while True:
        await asyncio.sleep(REAP_EVERY_S)
        try:
            await state.reap()
        except Exception:  # a failed close must not end the reaper
            logger.exception("unloading the idle models failed")


def install_guards(app: FastAPI, s: ServerSettings) -> None:
    """Each add_middleware wraps what is there: the last added runs first. Outermost to innermost:
    the request id, host/origin guard (no keys), body limit, CORS (answers preflights before auth),
    auth (keys)."""
    keys = s.keys()
    if keys:
        app.add_middleware(Auth, keys=keys)
    app.add_middleware(CORSMiddleware, allow_origins=s.origins, allow_origin_regex=loopback_origin_regex(),
                       allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(BodyLimit, limit=s.max_body_bytes, timeout_s=s.request_timeout_s)
    if not keys:
        allowed = Allowed.build(bound_host=s.host, extra_hosts=s.allowed_hosts, extra_origins=s.origins)
        app.add_middleware(HostGuard, allowed=allowed)
    app.add_middleware(RequestId)
