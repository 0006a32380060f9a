"""Ollama's model management on the endpoint: `/api/pull` downloads a model into the store that
`localspec models` manages (a registry name, or a Hub reference as Ollama takes it:
hf.co/USER/REPO[:QUANT]), with Ollama's progress lines; `/api/delete` removes one. Open WebUI's
model settings and `ollama pull`/`ollama rm` pointed here use them.

A pull runs on a thread of its own and is not cancelled by a client that goes away: what arrived is
kept, and the next pull of the same model resumes it or finds it installed. The profile's models are
never deleted from under the server; a model loaded on demand is unloaded first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from localspec.errors import DiskFullError, LocalspecError, ModelNotFoundError, UsageError
from localspec.server.errors import OLLAMA_ERROR_RESPONSES, APIError, OllamaError
from localspec.server.model_store import PullPhase, PullStep
from localspec.server.ollama import DeleteRequest, PullRequest, ndjson_dict
from localspec.server.state import ServerState, State
from localspec.server.streaming import EventStream

logger = logging.getLogger(__name__)
T = TypeVar("T")
router = APIRouter(tags=["ollama"])
NDJSON = "application/x-ndjson"
PULL_ERRORS: dict[int | str, dict[str, Any]] = {
    **OLLAMA_ERROR_RESPONSES,
    200: {"description": "NDJSON progress lines (stream true, the default), or one JSON object",
          "content": {NDJSON: {"schema": {"type": "object"}}, "application/json": {"schema": {"type": "object"}}}},
    502: {"model": OllamaError, "description": "every source of the model failed, or its file is not what was pinned"},
    507: {"model": OllamaError, "description": "the disk filled up"},
}
DELETE_ERRORS: dict[int | str, dict[str, Any]] = {
    **OLLAMA_ERROR_RESPONSES,
    200: {"description": "deleted: an empty body, as Ollama's", "content": {}},
    409: {"model": OllamaError, "description": "the server's profile uses the model, or a pull of it is running"},
}


@router.post("/api/pull", response_model=None, responses=PULL_ERRORS)
async def pull(body: PullRequest, state: State) -> JSONResponse | EventStream:
    checked: asyncio.Future[None] = asyncio.ensure_future(asyncio.to_thread(state.store.check, body.model))
    await pulled(checked)  # a name no pull could serve is an error status, streamed or not
    feed = PullFeed(asyncio.get_running_loop())
    done = feed.start(lambda: state.store.pull(body.model, feed.put), slots=state.pull_slots)
    if body.stream:
        return EventStream(feed.lines(done), media_type=NDJSON)
    await pulled(done)
    return JSONResponse({"status": PullPhase.SUCCESS.value})


@router.delete("/api/delete", response_class=Response, responses=DELETE_ERRORS)
async def delete(body: DeleteRequest, state: State) -> Response:
    model_id = await asyncio.to_thread(state.store.installed_id, body.model)
    if model_id is None:
        raise APIError(404, f"model '{body.model[:200]}' not found; GET /api/tags lists the installed models.",
                       "model_not_found", "model")
    if model_id in await served_by_profile(state):
        raise APIError(409, f"model '{body.model[:200]}' is one the server's profile loads; serve another profile "
                       "(localspec serve --profile NAME) before deleting it.", "model_in_use", "model")
    using = {key: r for key, r in state.extra.items() if model_id == key or model_id in r.model_ids()}
    if any(r.loader.loading for r in using.values()):  # a load in flight would land in a resident nobody holds
        raise APIError(409, f"model '{body.model[:200]}' is loading for a request; delete it once that request "
                       "is answered.", "model_in_use", "model")
    for key, r in using.items():  # loaded on demand, as a target or its draft: untracked first, then closed
        state.extra.pop(key, None)
        await state.unload(r)
    try:
        await asyncio.to_thread(state.store.remove, model_id)
    except ModelNotFoundError as exc:  # removed meanwhile by another delete or `localspec models rm`
        raise APIError(404, str(exc), "model_not_found", "model") from exc
    except LocalspecError as exc:  # a pull of it holds its lock
        raise APIError(409, str(exc), "model_in_use", "model") from exc
    return Response(status_code=200)


async def served_by_profile(state: ServerState) -> frozenset[str]:
    """The ids the profile's models load: its registry entry's, what the load resolved, and a --model
    pair's before it has loaded. A registry that cannot be read says nothing safe: the delete waits."""
    try:
        listed = await asyncio.to_thread(state.store.profile_models, state.settings.profile)
    except LocalspecError as exc:
        raise APIError(409, f"Cannot tell which models the server's profile loads ({exc}); fix the registry, "
                       "then delete again.", "model_in_use", "model") from exc
    flags = frozenset(m for m in (state.settings.target, state.settings.draft) if m)
    return listed | flags | frozenset(state.primary.model_ids())


class PullFeed:
    """A pull's steps, from its thread to the response: put() is called on the pulling thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.steps: asyncio.Queue[PullStep] = asyncio.Queue()

    def put(self, step: PullStep) -> None:
        try:
            self.loop.call_soon_threadsafe(self.steps.put_nowait, step)
        except RuntimeError:  # the server stopped (its loop closed): nobody is listening
            pass

    def start(self, work: Callable[[], str], *, slots: asyncio.Semaphore) -> asyncio.Future[str]:
        """Run `work` on a daemon thread once a pull slot is free: a server stopped mid-download exits
        at once (the store resumes the file next time) instead of waiting for the download."""
        done: asyncio.Future[str] = self.loop.create_future()

        def settle(result: str | None, error: BaseException | None) -> None:
            if done.cancelled():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result or "")

        def run() -> None:
            try:
                result, error = work(), None
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the request
                result, error = None, exc
            try:
                self.loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:
                pass

        async def when_free() -> None:
            async with slots:
                threading.Thread(target=run, name="pull", daemon=True).start()
                await asyncio.wait({done})

        self.runner = self.loop.create_task(when_free())  # held: a task with no reference may be collected
        done.add_done_callback(_retrieved)  # a client that left never awaits it: its failure is not an orphan
        return done

    async def lines(self, done: asyncio.Future[str]) -> AsyncIterator[bytes]:
        """Ollama's progress lines as the pull goes, then `success`, or its error line."""
        while True:
            getter = asyncio.ensure_future(self.steps.get())
            try:
                either: set[asyncio.Future[Any]] = {getter, done}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting = not getter.done()
                if waiting:  # the pull ended first, or the client left
                    getter.cancel()
            if waiting:
                break
            yield ndjson_dict(progress_line(getter.result()))
        while not self.steps.empty():  # the steps it put before it returned were scheduled first
            yield ndjson_dict(progress_line(self.steps.get_nowait()))
        try:
            await pulled(done)
        except APIError as exc:
            yield ndjson_dict({"error": exc.message})
            return
        yield ndjson_dict({"status": PullPhase.SUCCESS.value})


def _retrieved(done: asyncio.Future[str]) -> None:
    if not done.cancelled():
        done.exception()


def progress_line(step: PullStep) -> dict[str, Any]:
    """One of Ollama's pull lines. A download names its file by digest, which UIs key the progress
    bar by (Open WebUI shows a line without one as a notice); a file the registry does not pin is
    named by model instead."""
    if step.phase is PullPhase.DOWNLOAD:
        line: dict[str, Any] = {"status": f"pulling {step.digest[:12]}" if step.digest else
                                f"downloading {step.model_id}", "completed": step.completed}
        if step.digest:
            line["digest"] = f"sha256:{step.digest}"
        if step.total is not None:
            line["total"] = step.total
        return line
    if step.phase is PullPhase.RETRY:
        return {"status": f"{step.phase.value}: {step.message}" if step.message else step.phase.value}
    return {"status": step.phase.value}


async def pulled(done: asyncio.Future[T]) -> T:
    """The pulled model's id (or the check's None), or the failure as the API's error."""
    try:
        return await done
    except UsageError as exc:  # a malformed Hub reference
        raise APIError(400, str(exc), "invalid_value", "model") from exc
    except ModelNotFoundError as exc:
        raise APIError(404, str(exc), "model_not_found", "model") from exc
    except DiskFullError as exc:
        raise APIError(507, str(exc), "disk_full") from exc
    except LocalspecError as exc:  # every source failed, a hash or header was wrong
        raise APIError(502, str(exc), "pull_failed") from exc
    except OSError as exc:  # the store's disk, not the client's request
        raise APIError(502, f"The pull could not write the model: {exc}. Check the model store's disk "
                       "(localspec models du), then pull again.", "pull_failed") from exc
    except Exception as exc:
        logger.exception("the pull failed")
        raise APIError(500, f"The pull failed unexpectedly ({type(exc).__name__}); the server's log has the "
                       "details. Pull again, or with `localspec models pull NAME`.", "pull_failed") from exc
