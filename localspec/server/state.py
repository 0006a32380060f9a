"""What every route shares: the loader, admission (429s), metrics, and the way into the pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from localspec.engine.grammar import GrammarUnparsable
from localspec.errors import ContextOverflowError, LocalspecError, PredictionTooLongError
from localspec.jobs import CacheStatus, Job
from localspec.server.backend import Backend, Loader
from localspec.server.errors import APIError
from localspec.server.guards import LOCAL_PRINCIPAL, PRINCIPAL_KEY
from localspec.server.keepalive import KeepAlive
from localspec.server.model_store import MAX_PULLS, ModelStore, NoStore
from localspec.server.redact import redact_paths
from localspec.server.residents import (Held, MemoryProbe, ModelSource, NoModels, NoRoom, Room, plan_room,
                                        release_memory, system_memory)
from localspec.server.responses import ResponseStore
from localspec.server.settings import ServerSettings
from localspec.server.translate import Plan

if TYPE_CHECKING:
    from localspec.metrics import Metrics


logger = logging.getLogger(__name__)
MAX_NAMES = 16  # spellings remembered per model loaded on demand (hf.co references differ in case)
_ID_PREFIX = {False: "chatcmpl-", True: "cmpl-"}  # by whether the request was a raw prompt


class Admission:
    """Counts unfinished requests; beyond slots + queue the next one gets a 429."""

    def __init__(self, capacity: int, retry_after_s: int) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self.jobs: set[Job] = set()
        self.held = 0  # work admitted outside the engine (embeddings), counted against the same capacity

    def unfinished(self) -> int:
        """Only reads: the completion thread counts too (the queue-depth gauge), and a pruned copy stored
        from there lost any job the loop admitted between the copy and the store."""
        return sum(not j.done.is_set() for j in list(self.jobs)) + self.held

    def check(self) -> None:
        """On the loop, which alone writes `jobs`: finished ones are dropped here."""
        self.jobs = {j for j in self.jobs if not j.done.is_set()}
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


@dataclass(eq=False)
class Hold:
    """One request's claim on a resident's models, from before their load to the end of its reply
    (an embedding, a reply's logprob pieces read the model): while any is held, neither the reaper
    nor room-making unloads them, and `stop` closes them only once those held are released."""

    resident: Resident
    backend: Backend | None = None  # the models it uses; None until they are loaded
    released: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set on release: `stop` awaits it

    def release(self) -> None:
        """Idempotent: a stream releases it when it ends and when its response closes (on the loop)."""
        if not self.released:
            self.released = True
            self.done.set()
            self.resident.holds.discard(self)
            self.resident.keep_alive.touch()  # expiry counts from the last request's end


@dataclass
class Resident:
    """Models this server loads and unloads together, with their own keep-alive: the profile's (key
    ""), or an installed model a request named (key: its id), loaded on demand."""

    key: str
    loader: Loader
    keep_alive: KeepAlive
    need_bytes: int = 0  # estimated memory once loaded (0: unknown)
    names: set[str] = field(default_factory=set)  # the names requests used for it
    holds: set[Hold] = field(default_factory=set)  # requests using its models outside a running job
    jobs: set[Job] = field(default_factory=set)  # its admitted requests
    counted: Backend | None = None  # the load its keep-alive has counted from (the reaper's)

    @property
    def in_hand(self) -> int:
        return len(self.holds)

    def hold(self) -> Hold:
        h = Hold(self)
        self.holds.add(h)
        return h

    def busy(self) -> bool:
        self.jobs = {j for j in self.jobs if not j.done.is_set()}
        return bool(self.holds) or bool(self.jobs)

    @property
    def held(self) -> bool:
        """Loaded or loading: it takes (or is about to take) memory."""
        return self.loader.backend is not None or self.loader.loading

    def model_ids(self) -> tuple[str, ...]:
        """The files it loads, once a load has said (target, draft); before that its key."""
        c = self.loader.catalog
        if c is None:
            return (self.key,) if self.key else ()
        return tuple(m for m in (c.target_id, c.draft_id) if m)


@dataclass
class ServerState:
    settings: ServerSettings
    loader: Loader  # the profile's models
    admission: Admission
    metrics: Metrics
    keep_alive: KeepAlive = field(default_factory=KeepAlive)  # the profile's models'
    models: ModelSource = field(default_factory=NoModels)  # installed models a request may load on demand
    store: ModelStore = field(default_factory=NoStore)  # what /api/pull and /api/delete manage
    memory: MemoryProbe = system_memory
    extra: dict[str, Resident] = field(default_factory=dict)  # model id -> models loaded on demand
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses' previous_response_id
    primary: Resident = field(init=False)

    def __post_init__(self) -> None:
        self.primary = Resident("", self.loader, self.keep_alive)
        self._room = asyncio.Lock()  # one room plan and load start at a time: two loads never count the same RAM
        self.pull_slots = asyncio.Semaphore(MAX_PULLS)

    def residents(self) -> list[Resident]:
        return [self.primary, *self.extra.values()]

    def served_names(self) -> set[str]:
        c = self.loader.catalog
        return {*(c.names if c else ()), *(n for r in self.extra.values() for n in r.names)}

    async def resident_for(self, name: str) -> Resident:
        """The models a chat/completion request's name means: the profile's, or an installed model,
        loaded on demand (else a 404). While the first load runs the profile's answer (its 503);
        after it failed, installed models are still looked up."""
        c = self.loader.catalog
        if (c is None and self.loader.state != "error") or (c is not None and name in c.names):
            return self.primary
        known = next((r for r in self.extra.values() if name in r.names), None)
        if known is not None:
            return known
        self.admission.check()  # a busy server answers 429 before scanning the store for a name
        found = await asyncio.to_thread(self.models.find, name)
        if found is None and c is None:  # the profile's names are unknown until a load succeeds: it answers
            return self.primary
        if found is None:
            raise not_found(name, self.served_names())
        if found.id in ((c.target_id if c else None), self.settings.target):  # another spelling of the profile's
            return self.primary
        r = self.extra.get(found.id)
        if r is None:
            r = Resident(found.id, self.loader.sibling(self.settings.model_copy(update=on_demand_settings(found.id))),
                         KeepAlive(self.keep_alive.default, self.keep_alive.clock))
            self.extra[found.id] = r
        if len(r.names) < MAX_NAMES:
            r.names.add(name)
        return r

    async def ready(self, resident: Resident | None = None) -> Backend:
        """The loaded models; after an unload (keep-alive, stop) this request loads them again and waits,
        as for a model loaded on demand. The profile's first load at start-up keeps its 503 + Retry-After:
        clients already retry on it. A failed load is tried again by a later request, at most once per
        Retry-After, so clients retrying on its 503 do not load in a tight loop."""
        r = resident or self.primary
        loader = r.loader
        retry = loader.state == "error" and loader.may_retry(self.settings.retry_after_s)
        if r is self.primary:
            if loader.backend is None and (loader.state == "idle" or retry):
                await self.make_room(r)
            wait = loader.loads > 1
        else:
            if loader.backend is None and not loader.loading and (loader.error is None or retry):
                await self.make_room(r)
            wait = True
        if wait:
            while loader.backend is None and loader.loading:
                await asyncio.sleep(0.05)
        return self.backend(r)

    async def make_room(self, r: Resident) -> None:
        """Start loading `r` once its estimate fits, unloading idle models least recently used first;
        a 503 naming cause and fix when it cannot fit. Models with requests in flight stay."""
        async with self._room:
            if r.held:
                return
            for x in self.residents():
                await self.need_bytes(x)  # kept on each resident: the plan below reads them without awaiting
            memory = await asyncio.to_thread(self.memory)
            # No await from here to the detach: the plan reads the state as it is now, and a request
            # taking a victim in between would lose it.
            if r.held:
                return
            others = [x for x in self.residents() if x is not r and x.held]
            held = [Held(self.label(x), x.need_bytes, x.busy(), x.keep_alive.last_used, loading=x.loader.loading)
                    for x in others]
            plan = plan_room(r.need_bytes, memory, held) if r.need_bytes else Room(())
            if isinstance(plan, NoRoom):
                raise no_room(self.label(r), plan, self.settings.retry_after_s)
            victims = [x for label in plan.evict for x in others if self.label(x) == label]
            for x in victims:
                logger.info("unloading %s to make room for %s", self.label(x), self.label(r))
            detached = [b for b in (x.loader.detach() for x in victims) if b is not None]
            # One thread closes them all, each in its own try: one failed close or this task's
            # cancellation cannot leave the others detached and open.
            await asyncio.shield(asyncio.to_thread(close_all, detached))
            if r.key:
                logger.info("loading %s on demand", r.key)
            r.loader.start()

    def cancel_running(self) -> None:
        """Shutdown past its grace: cancel every admitted request, queued or decoding. Each still
        answers, while its connection is open: the 503 `cancelled`, or a stream's error event and [DONE]."""
        for job in list(self.admission.jobs):
            job.cancel()

    def close(self, drain: bool = False) -> None:
        """Shutdown: every loaded model, the profile's and those loaded on demand."""
        for r in self.residents():
            r.loader.close(drain)

    def label(self, r: Resident) -> str:
        """How logs and errors name a resident: its model id; the profile's target for the profile's."""
        c = self.loader.catalog
        return r.key or (c.target_id if c else "the profile's models")

    async def need_bytes(self, r: Resident) -> int:
        """Its estimate: from the files its last load named (a paired draft included), else from its
        id and the draft the registry pairs with it."""
        ids = r.model_ids()
        if r.key and r.loader.catalog is None:  # not loaded yet: its draft, where cheaply known, loads too
            draft = await asyncio.to_thread(self.models.draft_for, r.key)
            ids = (*ids, draft) if draft else ids
        if ids:
            r.need_bytes = sum([await asyncio.to_thread(self.models.need_bytes, m) for m in ids])
        return r.need_bytes

    @contextlib.asynccontextmanager
    async def holding(self, resident: Resident | None = None) -> AsyncIterator[tuple[Backend, Hold]]:
        """The loaded models (loaded first if need be) and a hold on them, released when the block
        ends unless the caller has handed the hold on (`Hold.release` is idempotent)."""
        r = resident or self.primary
        hold = r.hold()
        try:
            b = await self.ready(r)
            hold.backend = b  # no await since ready() returned: this is the backend it found
            yield b, hold
        finally:
            hold.release()

    @contextlib.asynccontextmanager
    async def serving(self, model: str, keep_alive: str | float | None) -> AsyncIterator[tuple[Backend, Hold]]:
        """The models for one request's `model`, from its model check to its reply: neither the
        keep-alive reaper nor another model's load unloads them while the hold is held. The block
        ends at submission; a route that builds its reply later takes the hold with it (`keep`).
        `keep_alive`: the request's, for these models."""
        r = await self.resident_for(model)
        c = self.loader.catalog
        if r is self.primary and c is not None:
            check_model(model, set(c.names))  # before ready(): a name it does not serve loads nothing
        async with self.holding(r) as (b, hold):
            if r is self.primary:
                check_model(model, b.target_names)
            r.keep_alive.ask(keep_alive)
            yield b, hold

    def keep(self, hold: Hold) -> Hold:
        """A second hold on the same models, for a reply built after `serving`'s block ends."""
        kept = hold.resident.hold()
        kept.backend = hold.backend
        return kept

    def busy(self) -> bool:
        """The profile's models have requests in hand or running."""
        return self.primary.busy()

    async def reap(self) -> bool:
        """One pass of the keep-alive reaper (on the event loop): unload idle models past their expiry."""
        unloaded = False
        for r in self.residents():
            b = r.loader.backend
            if b is None:
                continue
            if r.busy() or b is not r.counted:
                # Expiry counts from the last request's end, or from the load's: a load that took longer than
                # the keep-alive (a large model, a slow disk) was unloaded as soon as it was done.
                r.counted = b
                r.keep_alive.touch()
            elif r.keep_alive.expired():
                unloaded = await self.unload(r, idle_only=True) or unloaded
        return unloaded

    async def unload(self, resident: Resident | None = None, *, idle_only: bool = False) -> bool:
        """Unload now (`stop`, the reaper: `idle_only`); False when nothing was loaded. Running jobs are cancelled;
        requests holding these models (between their model check and submission, or building their
        reply) finish with them before the close, so none reads a freed model. Under the room lock:
        a load planning room meanwhile sees these models until they are closed."""
        r = resident or self.primary
        async with self._room:
            if idle_only and r.busy():  # a request came while the reaper waited for the lock
                return False
            b = r.loader.detach()
            if b is None:
                return False
            for job in list(r.jobs):
                job.cancel()
            # Awaited, not polled: each hold sets its event when its request is done with the models.
            await asyncio.gather(*(h.done.wait() for h in list(r.holds) if h.backend is b))
            await asyncio.shield(asyncio.to_thread(close_all, [b]))
        return True

    def resident_named(self, name: str) -> Resident | None:
        """The loaded-or-known models a name means (`stop`), without loading anything."""
        c = self.loader.catalog
        if c is not None and (name in c.names or name in c.embedding_names):
            return self.primary
        return next((r for r in self.extra.values() if name in r.names or name == r.key), None)

    def backend(self, resident: Resident | None = None) -> Backend:
        """The loaded models, or a 503 that says whether they are loading or failed."""
        loader = (resident or self.primary).loader
        if loader.backend is None:
            if loader.error:
                raise APIError(503, f"Loading the models failed: {redact_paths(loader.error)}",
                               "model_load_failed")
            raise APIError(503, "The models are still loading; retry in a few seconds.", "model_loading",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        return loader.backend

    def queue_depth(self) -> int:
        """Admitted requests that are not in a slot yet, over every loaded model. Also run on the
        completion thread while the loop adds or unloads models: each backend is read once."""
        backends = [r.loader.backend for r in [self.primary, *list(self.extra.values())]]
        running = sum(slot.active is not None for b in backends if b is not None for slot in b.engine.slots)
        return max(0, self.admission.unfinished() - running)

    async def submit(self, b: Backend, plan: Plan, *, model: str, owner: str) -> Job:
        """Admit (else 429) and hand the request to the pipeline, off the event loop (it tokenizes).
        Counted from the check on (`hold`), not from the job: a burst of 40 all passed the check while
        the first ones were still tokenizing, and all 40 were queued against a capacity of 20."""
        with self.admission.hold():
            job = await self._submitted(b, plan, model=model, owner=owner)
            owners = [r for r in self.residents() if r.loader.backend is b]
            if not owners:  # unloaded (`stop`) while it was tokenized: these models are about to close
                job.cancel()
                raise APIError(503, CANCELLED, "cancelled", headers={"Retry-After": str(self.settings.retry_after_s)})
            self.admission.jobs.add(job)
        for r in owners:
            r.jobs.add(job)
        self.metrics.set_queue_depth(self.queue_depth())
        return job

    async def _submitted(self, b: Backend, plan: Plan, *, model: str, owner: str) -> Job:
        """The pipeline's job for this request, or the 400 that says why the request cannot run."""
        try:
            return await asyncio.to_thread(
                b.pipeline.submit, plan.request, route=b.route_for(model), grammar_enforced=plan.grammar_enforced,
                use_cache=plan.cache, bypass_reason=plan.cache_bypass, owner=owner,
            )
        except ContextOverflowError as exc:
            raise APIError(
                400, f"This prompt has {exc.prompt_tokens} tokens but the model's context holds {exc.n_ctx} tokens "
                f"per request (prompt_tokens={exc.prompt_tokens}, n_ctx={exc.n_ctx}); shorten the prompt, or start the "
                "server with a larger --n-ctx.",
                "context_length_exceeded", plan.prompt_field,
            ) from exc
        except PredictionTooLongError as exc:
            raise APIError(
                400, f"The prediction has {exc.prediction_tokens} tokens but the model's context holds {exc.n_ctx} "
                "tokens per request; send a shorter prediction.", "context_length_exceeded", "prediction",
            ) from exc
        except GrammarUnparsable as exc:
            if plan.grammar_field is None:  # a grammar made here from a schema: no field of the client's to name
                raise APIError(400, str(exc), "invalid_request") from exc
            raise APIError(400, f"{plan.grammar_field}: {exc}", "invalid_grammar", plan.grammar_field) from exc
        except LocalspecError as exc:
            raise APIError(400, str(exc), "invalid_request") from exc

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
        try:
            self.metrics.set_queue_depth(self.queue_depth())
        except RuntimeError:  # the loop changed the models meanwhile: the gauge waits for the next request
            logger.debug("queue depth not updated", exc_info=True)
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


CANCELLED = ("Generation was cancelled before it finished (the server is shutting down or reloading its models); "
             "retry the request.")


def on_demand_settings(model_id: str) -> dict[str, object]:
    """What a model loaded on demand changes in the server's settings: its own target, no draft
    named (pairing finds one), no router or embedding model; no `--lora` (that adapter is the
    profile target's: the model's own models.toml binding applies); and no semantic cache, since
    each pipeline would open its own SemanticCache on the same directory (sharing one across
    targets is not simple)."""
    return {"target": model_id, "draft": None, "router": False, "embeddings": False,
            "lora_path": None, "lora_scale": 1.0, "cache": False}


def close_all(backends: list[Backend]) -> None:
    """Close detached models on one thread, each in its own try: a failed close is logged, the rest close.
    Then what they leave (cycles holding descriptors, freed heap) goes back to the system."""
    for b in backends:
        try:
            b.close(False)
        except Exception:
            logger.exception("closing unloaded models failed")
    release_memory()


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def principal(request: Request) -> str:
    """Who is asking: the API key's owner, or the local user when the server has no keys."""
    return str(request.scope.get(PRINCIPAL_KEY, LOCAL_PRINCIPAL))


def check_model(name: str, names: set[str]) -> None:
    if name not in names:
        raise not_found(name, names)


def not_found(name: str, names: set[str]) -> APIError:
    served = ", ".join(sorted(names)) or "none"
    return APIError(404, f"The model '{name}' does not exist on this server (serving: {served}).",
                    "model_not_found", "model")


def no_room(model: str, plan: NoRoom, retry_after_s: int) -> APIError:
    """Why a model cannot load now, and what to do about it."""
    gb = 1e9
    if plan.busy:
        return APIError(503, f"Loading {model} needs about {plan.need_bytes / gb:.1f} GB but only "
                        f"{plan.room_bytes / gb:.1f} GB can be freed while {', '.join(plan.busy)} "
                        "finish their requests; retry when they finish, or `localspec stop` a model.",
                        "insufficient_memory", "model", headers={"Retry-After": str(retry_after_s)})
    return APIError(503, f"Loading {model} needs about {plan.need_bytes / gb:.1f} GB but this machine has "
                    f"{plan.room_bytes / gb:.1f} GB free; use a smaller quant, a smaller --n-ctx or fewer "
                    "--parallel slots, or free memory.", "insufficient_memory", "model")


State = Annotated[ServerState, Depends(server_state)]
Principal = Annotated[str, Depends(principal)]
