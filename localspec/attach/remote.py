"""A reply from an OpenAI-compatible server, read as the engine's own events (`Token`s, then `Done`).

Against a localspec server (`localspec=True`) the request asks for what the in-process faces show:
each text chunk's token origin (`localspec.origins`), the speculation mode and draft length, and the
final chunk's `localspec` object becomes the reply's `Stats`. Another server gets a plain request.
Whatever comes back is untrusted: fields that do not parse are left out, never raised.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localspec.engine.config import GenerationRequest
from localspec.engine.events import ORIGINS, Done, Event, FinishReason, Origin, Stats, Token
from localspec.engine.thoughts import CLOSE, OPEN
from localspec.errors import LocalspecError

if TYPE_CHECKING:  # openai loads only when a client is built
    from openai import OpenAI


def openai_client(base_url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> OpenAI:
    """The one way localspec talks to an OpenAI-compatible server (the chat app's --connect and an
    attached face, `generate`/`edit` against a server, the router's remote tier): the official
    `openai` client at `base_url` as given (a hosted API's may not end in /v1; see `api_base` for a
    server's root URL), with no retries of its own, since each caller decides what a failure means
    (the remote tier retries through its circuit breaker)."""
    try:
        from openai import OpenAI
    except ImportError as exc:  # pragma: no cover - openai is a dependency
        raise LocalspecError("The 'openai' package is missing.", "pip install openai") from exc
    return OpenAI(base_url=base_url, api_key=api_key or "localspec", max_retries=0, timeout=timeout_s)


def api_base(url: str) -> str:
    """A server's URL as the client's base URL: without a trailing slash, ending in /v1."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


class _Timings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prefill_ms: float = Field(0.0, ge=0)
    ttft_ms: float = Field(0.0, ge=0)
    decode_ms: float = Field(0.0, ge=0)


class _AutoReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    steps: dict[str, int] = Field(default_factory=dict)
    explored: int = Field(0, ge=0)
    why_not_draft: str | None = None


class WireStats(BaseModel):
    """The final chunk's `localspec` object (localspec.server.schemas.Extension), as a client reads it."""

    model_config = ConfigDict(extra="ignore")

    mode: str = Field(max_length=32)
    drafted: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)
    drafted_by_position: list[int] = Field(default_factory=list, max_length=64)
    accepted_by_position: list[int] = Field(default_factory=list, max_length=64)
    prompt_tokens: int = Field(0, ge=0)
    reused_prefix_tokens: int = Field(0, ge=0)
    target_passes: int = Field(0, ge=0)
    timings: _Timings = Field(default_factory=_Timings)
    auto: _AutoReport | None = None

    def apply(self, stats: Stats) -> None:
        """The server's figures over the client's own (a remote reply's TTFT includes the network)."""
        stats.mode = self.mode
        stats.drafted, stats.accepted = self.drafted, min(self.accepted, self.drafted)
        stats.drafted_by_position, stats.accepted_by_position = self.drafted_by_position, self.accepted_by_position
        stats.prompt_tokens, stats.reused_prefix_tokens = self.prompt_tokens, self.reused_prefix_tokens
        stats.target_passes = self.target_passes
        stats.prefill_ms, stats.ttft_ms, stats.decode_ms = (self.timings.prefill_ms, self.timings.ttft_ms,
                                                            self.timings.decode_ms)
        if self.auto is not None:
            stats.auto_steps, stats.explored = dict(self.auto.steps), self.auto.explored
            stats.auto_why_not = self.auto.why_not_draft or ""


class _PsModel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=512)
    role: str = Field(max_length=32)
    tier: str | None = Field(None, max_length=64)
    processor: str = Field("", max_length=64)
    n_ctx: int | None = Field(None, gt=0)


class _PsReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    models: list[_PsModel] = Field(default_factory=list, max_length=256)


@dataclass(frozen=True)
class ServedPair:
    """What a localspec server's /v1/ps says of the pair behind a served name (the metrics pane's
    draft, context size and processor, as an in-process engine gives them)."""

    draft: str | None
    n_ctx: int | None
    processor: str | None


def served_pair(report: object, target: str) -> ServedPair | None:
    """The pair serving `target` in a /v1/ps report; None when the report names no target (the
    models are unloaded, or it is not a report)."""
    try:
        models = _PsReport.model_validate(report).models
    except ValidationError:
        return None
    targets = [m for m in models if m.role == "target"]
    main = next((m for m in targets if m.name == target), targets[0] if targets else None)
    if main is None:
        return None
    draft = next((m.name for m in models if m.role == "draft" and m.tier == main.tier), None)
    return ServedPair(draft=draft, n_ctx=main.n_ctx, processor=main.processor or None)


def chunk_origin(ext: object) -> Origin:
    """A text chunk's origin from its `localspec` object; "target" when it says nothing we know."""
    origin = ext.get("origin") if isinstance(ext, dict) else None
    return origin if isinstance(origin, str) and _is_origin(origin) else "target"


def _is_origin(value: str) -> TypeGuard[Origin]:
    return value in ORIGINS


class RemoteGeneration:
    """One streamed reply. `keep_alive`: how long the server keeps its models after it (localspec only)."""

    def __init__(self, client: Any, model: str, request: GenerationRequest,
                 clock: Callable[[], float] = time.perf_counter, *, localspec: bool = False,
                 keep_alive: str | None = None) -> None:
        self._client = client
        self._model = model
        self._request = request
        self._clock = clock
        self._localspec = localspec
        self._keep_alive = keep_alive
        self._cancel = threading.Event()
        self._stream: Any = None  # the openai client's stream while one is open
        self.dropped_messages = 0
        self.cached: bool | None = None
        self.cache_entry: str | None = None
        self.route: str | None = None

    def _kwargs(self) -> dict[str, Any]:
        req = self._request
        kwargs: dict[str, Any] = dict(model=self._model, stream=True, max_tokens=req.max_tokens,
                                      stream_options={"include_usage": True})
        # A temperature the user did not set is left to the model's own settings on a localspec server,
        # under this face's fallback (below), as in-process; another server knows no such settings.
        chosen = "temperature" in req.sampling.model_fields_set
        if chosen or not self._localspec:
            kwargs["temperature"] = req.sampling.temperature
        if req.sampling.top_p != 1.0:
            kwargs["top_p"] = req.sampling.top_p
        if req.sampling.seed is not None:
            kwargs["seed"] = req.sampling.seed
        if req.stop:
            kwargs["stop"] = req.stop
        extra: dict[str, Any] = {}
        if req.template_vars:  # llama-server's and vLLM's name, as this server's
            extra["chat_template_kwargs"] = req.template_vars
        if req.prediction is not None:  # Predicted Outputs; extra_body: clients before openai 1.54 lack the field
            extra["prediction"] = {"type": "content", "content": req.prediction}
        if self._localspec:
            extra["localspec"] = {"origins": True, **({"mode": req.mode} if req.mode else {}),
                                  **({"k": req.k} if req.k is not None else {}),
                                  **({} if chosen else {"default_temperature": req.sampling.temperature})}
            if self._keep_alive is not None:
                extra["keep_alive"] = self._keep_alive
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _open(self) -> Any:
        req = self._request
        if req.messages:
            messages = [m.model_dump(include={"role", "content"}) for m in req.messages]
            return self._client.chat.completions.create(messages=messages, **self._kwargs())
        if req.prompt is not None and self._localspec:  # a raw prompt: only a server we know completes it as we do
            return self._client.completions.create(prompt=req.prompt, **self._kwargs())
        raise LocalspecError("The remote backend takes chat messages only.", "Use the chat screen.")

    def __iter__(self) -> Iterator[Event]:
        stats = Stats(mode="remote")
        text: list[str] = []
        t0 = self._clock()
        t_first = t_last = 0.0
        finish: FinishReason = "stop"
        final: WireStats | None = None
        # A server that ignores max_tokens streamed 64 KB chunks forever, and the text grew 100 MB/s: no
        # token is this long, so past it the reply stops with an error.
        budget, received, chunks = self._request.max_tokens * MAX_CHARS_PER_TOKEN + 4096, 0, 0
        thinking = ThoughtTags()
        try:
            self._stream = self._open()
            if (answered := _not_a_stream(self._stream)) is not None:
                yield Done("error", stats, "", error=answered)
                return
            for chunk in self._stream:
                chunks += 1
                if self._cancel.is_set():
                    finish = "cancelled"
                    break
                ext = (getattr(chunk, "model_extra", None) or {}).get("localspec")
                final = self._read_extension(ext) or final
                if getattr(chunk, "usage", None):
                    prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    stats.prompt_tokens = prompt if _count(prompt) else 0  # "xyz" or -5 crashed the stats line
                    if _count(completion) and completion:
                        stats.completion_tokens = completion
                    _read_prediction_usage(stats, getattr(chunk.usage, "completion_tokens_details", None))
                for choice in chunk.choices or []:
                    delta = getattr(choice, "delta", None)
                    piece = delta.content if delta is not None else getattr(choice, "text", None)
                    piece = thinking.wrap(reasoning_of(delta), piece if isinstance(piece, str) else None)
                    if isinstance(piece, str) and piece:  # a number or a list in its place is left out
                        received += len(piece)
                        if received > budget:
                            raise LocalspecError(
                                f"The server sent over {budget:,} characters for max_tokens={self._request.max_tokens}"
                                "; the reply stops here.", "The server ignores max_tokens: check what it is.")
                        now = self._clock()
                        if not t_first:
                            t_first = now
                            stats.ttft_ms = (now - t0) * 1000
                        t_last = now
                        text.append(piece)
                        stats.completion_tokens += 1  # one chunk ~ one token; usage corrects it
                        yield Token(text=piece, ids=(), origin=chunk_origin(ext))
                    if choice.finish_reason:
                        finish = "length" if choice.finish_reason == "length" else "stop"
        except Exception as exc:  # network, HTTP or server errors end the reply, not the face
            if self._cancel.is_set():
                finish = "cancelled"
            else:
                stats.decode_ms = (t_last - t_first) * 1000 if t_first else 0.0
                yield Done("error", stats, "".join(text), error=remote_error(exc))
                return
        finally:
            self._close_stream()
        stats.decode_ms = (t_last - t_first) * 1000 if t_first else 0.0
        if not chunks and finish != "cancelled":  # a 200 that streamed nothing is no answer
            yield Done("error", stats, "", error="The server's answer held no streamed chunk.")
            return
        if final is not None:
            final.apply(stats)
        yield Done(finish, stats, "".join(text))

    def _read_extension(self, ext: object) -> WireStats | None:
        """A localspec server's last chunk: whether the answer came from its cache, the route, the stats."""
        if not isinstance(ext, dict) or "mode" not in ext:
            return None  # absent, or a text chunk's origin
        cache, route = ext.get("cache") or {}, ext.get("route")
        if isinstance(cache, dict) and cache:
            self.cached = cache.get("status") == "hit"
            # The handle F3 gives back: the entry and the token that lets this client mark it wrong.
            entry, token = cache.get("entry_id"), cache.get("verdict_token")
            self.cache_entry = f"{entry}.{token}" if self.cached and entry and token else None
        if isinstance(route, dict):
            self.route = f"{route.get('tier')} ({route.get('reason')})"
        try:
            return WireStats.model_validate(ext)
        except ValidationError:
            return None

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass

    def cancel(self) -> None:
        self._cancel.set()
        self._close_stream()  # unblocks a read waiting on the socket


def reasoning_of(delta: object) -> str | None:
    """A thinking model's thought in a chunk's delta, where the server sends it apart from the content:
    `reasoning_content` (llama-server, localspec, DeepSeek's API) or `reasoning` (vLLM, OpenRouter)."""
    extra = getattr(delta, "model_extra", None) or {}
    for name in ("reasoning_content", "reasoning"):
        value = extra.get(name)
        if isinstance(value, str) and value:
            return value
    return None


class ThoughtTags:
    """A thought sent apart from the content, put back in its `<think>` tags before the content, as
    the model wrote it and as an in-process reply has it: the chat app shows (and stores) one shape."""

    def __init__(self) -> None:
        self.open = False

    def wrap(self, thought: str | None, content: str | None) -> str:
        out = ""
        if thought:
            out += thought if self.open else f"{OPEN}\n{thought}"
            self.open = True
        if content and self.open:
            out += f"\n{CLOSE}\n\n"
            self.open = False
        return out + (content or "")


def _read_prediction_usage(stats: Stats, details: Any) -> None:
    """The server's Predicted Outputs counts (usage.completion_tokens_details) into the reply's stats.
    Every prediction token it drafted was accepted or rejected, so drafted is their sum. Counts that
    are not non-negative integers (another server's idea of the field) are ignored."""
    accepted = getattr(details, "accepted_prediction_tokens", None)
    rejected = getattr(details, "rejected_prediction_tokens", None)
    if _count(accepted) and _count(rejected):
        stats.prediction_accepted, stats.prediction_drafted = accepted, accepted + rejected


def _count(n: object) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


MAX_CHARS_PER_TOKEN = 64  # far over any vocabulary's longest token: what a reply may hold per max_tokens


def _not_a_stream(stream: Any) -> str | None:
    """Why a 200 is no stream of events, quoting the server (a JSON error body was an empty answer)."""
    response = getattr(stream, "response", None)
    kind = str(getattr(response, "headers", {}).get("content-type", "")).split(";")[0].strip().lower()
    if response is None or not kind or kind == "text/event-stream":
        return None
    try:
        body = response.read()[:4096].decode("utf-8", "replace")
    except Exception:
        body = ""
    message = body
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
    except ValueError:
        pass
    said = " ".join(message.split())[:300]
    return f"The server answered {kind}, not a stream of events{f': {said}' if said else ''}."


def remote_error(exc: Exception) -> str:
    """One line for a failed remote reply; an HTTP refusal as the server's own message."""
    if isinstance(exc, LocalspecError):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):  # an event whose data is not JSON
        return f"the server sent an event that is not JSON ({exc.msg} at character {exc.pos})"
    status, body = getattr(exc, "status_code", None), getattr(exc, "body", None)
    if isinstance(status, int) and isinstance(body, dict):
        err = body.get("error", body)
        message = err.get("message") if isinstance(err, dict) else None
        if isinstance(message, str) and message:
            return f"the server answered {status}: {' '.join(message.split())[:500]}"
    name = type(exc).__name__
    return f"{name}: {exc}"
