"""What every route shares: the loader, admission (429s), metrics, and the way into the pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from localspec.errors import ContextOverflowError, LocalspecError, PredictionTooLongError
from localspec.jobs import CacheStatus, Job
from localspec.server.backend import Backend, Loader
from localspec.server.errors import APIError
from localspec.server.guards import LOCAL_PRINCIPAL, PRINCIPAL_KEY
from localspec.server.keepalive import KeepAlive
from localspec.server.redact import redact_paths
from localspec.server.settings import ServerSettings
from localspec.server.translate import Plan

if TYPE_CHECKING:
    from localspec.metrics import Metrics


_ID_PREFIX = {False: "chatcmpl-", True: "cmpl-"}  # by whether the request was a raw prompt


class Admission:
    """Counts unfinished requests; beyond slots + queue the next one gets a 429."""

    def __init__(self, capacity: int, retry_after_s: int) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self.jobs: set[Job] = set()
        self.held = 0  # work admitted outside the engine (embeddings), counted against the same capacity

    def unfinished(self) -> int:
        self.jobs = {j for j in self.jobs if not j.done.is_set()}
        return len(self.jobs) + self.held

    def check(self) -> None:
        if self.unfinished() >= self.capacity:
            raise APIError(429, f"The server is busy ({self.capacity} requests running or queued). Retry shortly.",
                           "queue_full", headers={"Retry-After": str(self.retry_after_s)})

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Admit one piece of work that is not an engine job, for as long as the block runs."""
        self.check()
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1


@dataclass
class ServerState:
    settings: ServerSettings
    loader: Loader
    admission: Admission
    metrics: Metrics
    keep_alive: KeepAlive = field(default_factory=KeepAlive)
    in_hand: int = 0  # requests between finding the models and submitting to them: not to be unloaded under

    async def ready(self) -> Backend:
        """The loaded models; after an unload (keep-alive, stop) this request loads them again and waits.
        The first load at start-up keeps its 503 + Retry-After: clients already retry on it."""
        loader = self.loader
        if loader.backend is None and loader.state == "idle":
            loader.start()
        if loader.loads > 1:
            while loader.backend is None and loader.loading:
                await asyncio.sleep(0.05)
        return self.backend()

    @contextlib.asynccontextmanager
    async def serving(self, keep_alive: str | float | None) -> AsyncIterator[Backend]:
        """The models for one request, from its model check to its submission (then admission holds
        them): the keep-alive reaper never unloads them in between. `keep_alive`: the request's."""
        self.in_hand += 1
        try:
            b = await self.ready()
            self.keep_alive.ask(keep_alive)
            yield b
        finally:
            self.in_hand -= 1
            self.keep_alive.touch()

    def busy(self) -> bool:
        return self.in_hand > 0 or self.admission.unfinished() > 0

    async def reap(self) -> bool:
        """One pass of the keep-alive reaper (on the event loop): unload idle models past their expiry."""
        if self.loader.backend is None:
            return False
        if self.busy():
            self.keep_alive.touch()  # expiry counts from the last request's end
            return False
        if not self.keep_alive.expired():
            return False
        return await self.unload()

    async def unload(self) -> bool:
        """Unload now (`stop`, or the reaper); False when nothing was loaded."""
        b = self.loader.detach()
        if b is None:
            return False
        await asyncio.to_thread(b.close, False)
        return True

    def backend(self) -> Backend:
        """The loaded models, or a 503 that says whether they are loading or failed."""
        if self.loader.backend is None:
            if self.loader.error:
                raise APIError(503, f"Loading the models failed: {redact_paths(self.loader.error)}",
                               "model_load_failed")
            raise APIError(503, "The models are still loading; retry in a few seconds.", "model_loading",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        return self.loader.backend

    def queue_depth(self, b: Backend) -> int:
        """Admitted requests that are not in a slot yet."""
        return max(0, self.admission.unfinished() - sum(slot.active is not None for slot in b.engine.slots))

    async def submit(self, b: Backend, plan: Plan, *, model: str, owner: str) -> Job:
        """Admit (else 429) and hand the request to the pipeline, off the event loop (it tokenizes)."""
        self.admission.check()
        try:
            job = await asyncio.to_thread(
                b.pipeline.submit, plan.request, route=b.route_for(model), grammar_enforced=plan.grammar_enforced,
                use_cache=plan.cache, owner=owner,
            )
        except ContextOverflowError as exc:
            raise APIError(
                400, f"This prompt has {exc.prompt_tokens} tokens but the model's context holds {exc.n_ctx} tokens "
                f"per request (prompt_tokens={exc.prompt_tokens}, n_ctx={exc.n_ctx}).",
                "context_length_exceeded", "messages",
            ) from exc
        except PredictionTooLongError as exc:
            raise APIError(
                400, f"The prediction has {exc.prediction_tokens} tokens but the model's context holds {exc.n_ctx} "
                "tokens per request; send a shorter prediction.", "context_length_exceeded", "prediction",
            ) from exc
        except LocalspecError as exc:
            raise APIError(400, str(exc), "invalid_request") from exc
        self.admission.jobs.add(job)
        self.metrics.set_queue_depth(self.queue_depth(b))
        return job

    def attach(self, b: Backend) -> None:
        """Every request the pipeline finishes is recorded through its one completion hook.
        (A `load` that returns something else, as tests of the routes alone do, records nothing.)"""
        if isinstance(b, Backend):
            b.pipeline.on_finish = functools.partial(self.record, b)

    def record(self, b: Backend, job: Job) -> None:
        """One finished request in the metrics (the SQLite log and Prometheus); on the completion thread."""
        from localspec.metrics import RequestRecord

        done = job.result
        if done is None:
            return
        self.metrics.set_queue_depth(self.queue_depth(b))
        self.metrics.record(RequestRecord.from_stats(
            done.stats, face="api", profile=b.profile, target_model=b.target_id, draft_model=b.draft_id,
            finish_reason=done.finish_reason, e2e_ms=(time.perf_counter() - job.t_submit) * 1000,
            request_id=f"{_ID_PREFIX[job.request.messages is None]}{job.id}",
            error_class="engine" if done.finish_reason == "error" else None,
            cache=str(job.cache.status) if job.cache and job.cache.status is not CacheStatus.BYPASS else None,
            cache_similarity=job.cache.similarity if job.cache else None,
            route=str(job.route.tier) if job.route else str(job.tier),
            route_reason=job.route.reason if job.route else None,
        ))


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def principal(request: Request) -> str:
    """Who is asking: the API key's owner, or the local user when the server has no keys."""
    return str(request.scope.get(PRINCIPAL_KEY, LOCAL_PRINCIPAL))


def check_model(name: str, names: set[str]) -> None:
    if name not in names:
        served = ", ".join(sorted(names)) or "none"
        raise APIError(404, f"The model '{name}' does not exist on this server (serving: {served}).",
                       "model_not_found", "model")


State = Annotated[ServerState, Depends(server_state)]
Principal = Annotated[str, Depends(principal)]
