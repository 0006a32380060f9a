"""A job's events as the endpoint reads them: awaited, never polled, with keep-alives while a
request waits, and the client's disconnect awaited alongside so a request whose client is gone is
cancelled at once, queued or decoding."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from localspec.engine.events import Done, Event, Origin, Token
from localspec.jobs import Job

if TYPE_CHECKING:
    from localspec.metrics import Metrics

T = TypeVar("T")

KEEPALIVE_S = 10.0  # an SSE comment this often while nothing else is sent: proxies keep the stream open


@dataclass(frozen=True)
class Waiting:
    """Nothing happened for KEEPALIVE_S (queued, or a long prefill): time for a keep-alive."""


async def job_events(job: Job, metrics: Metrics, *, keepalive_s: float | None = None) -> AsyncIterator[Event | Waiting]:
    """The job's events as they come; cancels the request when the reader stops early."""
    events = job.subscribe()
    last: float | None = None
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), keepalive_s)
            except TimeoutError:
                yield Waiting()
                continue
            if isinstance(event, Token) and event.ids:
                now = time.perf_counter()
                if last is not None:
                    metrics.observe_inter_token(now - last)
                last = now
            yield event
            if isinstance(event, Done):
                return
    finally:
        if not job.done.is_set():
            job.cancel()


@dataclass(frozen=True)
class Piece:
    """Streamed text as it becomes certain, with the logprob-carrying tokens behind it."""

    text: str  # the content's
    tokens: list[Token]
    origin: Origin = "target"  # the origin of the token whose text this is
    thought: str = ""  # a thinking model's thought, which comes before the content (engine/thoughts.py)


class TextGate(Protocol):
    """Which of an answer's text may be sent as it comes: `feed` takes the next text and returns what
    became certain; what it holds is the reply's to send at the end (translate.Plan.text_gate)."""

    def feed(self, text: str) -> str: ...


class ThoughtGate(Protocol):
    """What of an answer's text is thought and what content, as it comes (reasoning.ThoughtSplit):
    `feed` returns the (thought, content) that became certain; `held` counts the characters it holds."""

    @property
    def held(self) -> int: ...

    def feed(self, text: str) -> tuple[str, str]: ...


async def pieces(job: Job, metrics: Metrics, *, gate: TextGate | None = None,
                 split: ThoughtGate | None = None) -> AsyncIterator[Piece | Done | Waiting]:
    """A streamed answer in Pieces, then its Done. `split` parts a thought from the content (None: all
    content); `gate` passes the content that is certain (None: all of it): what they hold at the end
    (a tool call, parsed whole) comes in no Piece. A logprob token comes with the first Piece whose
    sent text (thought or content, the thought's markers counted as sent) reaches past where the
    token's own text starts; those behind text held come in one Piece with no text before the Done.
    Logprob tokens that no text followed are not reported (see `collect`)."""
    pending: list[tuple[int, Token]] = []  # logprob tokens not reported yet, each with where its text starts
    seen = 0  # characters of the answer's text so far
    gated = passed = 0  # characters of content fed to the gate, and of those it passed
    async for event in job_events(job, metrics, keepalive_s=KEEPALIVE_S):
        if isinstance(event, Waiting):
            yield event
        elif isinstance(event, Done):
            if backed := [t for at, t in pending if at < seen]:
                yield Piece("", backed)
            yield event
            return
        else:
            if event.logprob is not None:
                pending.append((seen, event))
            if not event.text:
                continue
            seen += len(event.text)
            thought, content = ("", event.text) if split is None else split.feed(event.text)
            text = content if gate is None else gate.feed(content)
            gated, passed = gated + len(content), passed + len(text)
            if thought or text:
                sent = seen - (split.held if split is not None else 0) - (gated - passed)
                ready = [t for at, t in pending if at < sent]
                pending = pending[len(ready):]
                yield Piece(text, ready, event.origin, thought)


async def collect(job: Job, metrics: Metrics) -> tuple[list[Token], Done]:
    """A whole answer: its tokens that carry logprobs, and the Done.

    A token's text may come with a later token's (half a UTF-8 character, the start of a possible stop
    string), so a token is part of the answer once any text follows it. The tokens after the last text
    spelled a stop string, which the answer leaves out: so do its logprobs (llama-server trims them too),
    and the logprobs' tokens spell the answer. usage still counts them: they were generated."""
    tokens: list[Token] = []
    backed = 0
    async for event in job_events(job, metrics):
        if isinstance(event, Done):
            return tokens[:backed], event
        if isinstance(event, Token) and event.logprob is not None:
            tokens.append(event)
        if isinstance(event, Token) and event.text:
            backed = len(tokens)
    raise RuntimeError("a job's events ended without a Done")


async def _next(items: AsyncIterator[T]) -> tuple[bool, T | None]:
    """The next item (True, it), or (False, None) at the end: a task cannot end in StopAsyncIteration."""
    try:
        return True, await anext(items)
    except StopAsyncIteration:
        return False, None


async def interleaved(streams: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """The items of several streams as each comes, with the index of its stream: each stream's next
    item is awaited at once beside the others' (no polling). Closing this closes every stream, so
    their jobs are cancelled as one stream's reader leaving cancels its job."""
    if len(streams) == 1:  # one answer reads its stream as it always did: no task per item
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            with anyio.CancelScope(shield=True):
                await aclose(streams[0])
        return
    waiting: dict[asyncio.Task[tuple[bool, T | None]], int] = {}
    try:
        waiting.update({asyncio.ensure_future(_next(s)): i for i, s in enumerate(streams)})
        while waiting:
            ready, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(ready, key=waiting.__getitem__):  # several at once: in index order
                i = waiting.pop(task)
                more, got = task.result()
                if more:
                    yield i, cast(T, got)  # more: an item of the stream, not the end's None
                    waiting[asyncio.ensure_future(_next(streams[i]))] = i
    finally:
        for task in waiting:
            task.cancel()
        with anyio.CancelScope(shield=True):  # a cancelled reader (a client gone) still closes them all
            await asyncio.gather(*waiting, return_exceptions=True)
            for s in streams:
                await aclose(s)


async def aclose(items: AsyncIterator[object]) -> None:
    """Close an async generator (its `finally` runs now, not when it is collected); other iterators need nothing."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None as soon as the client disconnects (which cancels `work`). What `work`
    raises is raised as it is (an APIError its route answers), not inside the task group's ExceptionGroup."""
    result: list[T] = []
    failure: list[Exception] = []

    async def run() -> None:
        try:
            result.append(await work)
        except Exception as exc:
            failure.append(exc)
        tg.cancel_scope.cancel()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(watch)
    if failure:
        raise failure[0]
    return result[0] if result else None


def sse(obj: BaseModel) -> bytes:
    return b"data: " + obj.model_dump_json(exclude_none=True).encode() + b"\n\n"


SSE_KEEPALIVE = b": waiting\n\n"  # an SSE comment: clients ignore it
SSE_DONE = b"data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """An SSE response whose body and the client's disconnect are awaited together: whichever
    ends first ends the other, so a client gone while its request is queued cancels it at once
    (Starlette leaves the disconnect to a failed send under ASGI 2.4, and a queued stream sends nothing)."""

    def __init__(self, body: AsyncIterator[bytes], *, on_close: Callable[[], None] | None = None,
                 media_type: str = "text/event-stream") -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close  # runs once the response is written or abandoned (a hold on the models)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    await self.stream_response(send)
                    tg.cancel_scope.cancel()

                async def disconnect() -> None:
                    await self.listen_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                tg.start_soon(disconnect)
        finally:
            if self.on_close is not None:
                self.on_close()
        if self.background is not None:
            await self.background()
