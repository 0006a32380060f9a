"""The remote tier: an existing OpenAI-compatible server (vLLM, TGI, llama-server, a hosted API).

Through the official `openai` client, built as every attached face builds it
(`localspec.attach.remote.openai_client`), with its own retries (so the circuit breaker sees every
failed attempt): a connection error, a timeout, a 429 or a 5xx is retried with exponential
backoff; after the last attempt, or while the breaker is open, `stream_chat` raises
`RemoteUnavailable` before any text is produced, and the pipeline falls back to a local tier.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from localspec.attach.remote import ThoughtTags, openai_client, reasoning_of
from localspec.errors import LocalspecError
from localspec.router.breaker import CircuitBreaker
from localspec.router.tiers import TierSpec, check_remote_spec

if TYPE_CHECKING:
    import openai

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


class RemoteUnavailable(LocalspecError):
    """The remote tier cannot answer now (breaker open, unreachable, timing out, failing)."""


class RemoteTier:
    def __init__(self, spec: TierSpec, breaker: CircuitBreaker | None = None, attempts: int = 3,
                 backoff_s: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> None:
        if spec.kind != "remote":
            raise ValueError(f"tier {spec.name!r} is not a remote tier")
        self.spec = spec
        self.breaker = breaker or CircuitBreaker()
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._client: openai.OpenAI | None = None
        self._client_lock = threading.Lock()

    def check(self) -> None:
        """Start-up validation (URL, key env var); raises ConfigError. Contacts nothing."""
        check_remote_spec(self.spec, f"remote tier {self.spec.name!r}")

    def client(self) -> openai.OpenAI:
        """The attached faces' client (`openai_client`), built once; retries are this tier's own."""
        with self._client_lock:
            if self._client is None:
                self.check()
                key = os.environ.get(self.spec.api_key_env) if self.spec.api_key_env else None
                self._client = openai_client(self.spec.base_url or "", api_key=key, timeout_s=self.spec.timeout_s)
            return self._client

    def _unavailable(self, why: str) -> RemoteUnavailable:
        return RemoteUnavailable(
            f"The remote tier {self.spec.name!r} ({self.spec.base_url}) is unavailable: {why}.",
            "Check that the server is running and reachable; requests fall back to the local tiers meanwhile.",
        )

    def _open(self, **kwargs):
        """Start the stream, retrying what may pass; every failed attempt reaches the breaker."""
        import openai

        client = self.client()
        last = "no attempt was made"
        for attempt in range(self.attempts):
            if not self.breaker.allow():
                if attempt:  # this call's own failures opened it: report what actually went wrong
                    break
                wait = self.breaker.retry_in()
                raise self._unavailable(f"circuit open after repeated failures (retry in {wait:.0f} s)")
            try:
                stream = client.chat.completions.create(stream=True, **kwargs)
            except openai.APITimeoutError:
                last, retry = f"no answer within {self.spec.timeout_s:g} s", True
            except openai.APIConnectionError as exc:
                last, retry = f"connection failed ({exc.__cause__ or exc})", True
            except openai.APIStatusError as exc:
                last, retry = f"HTTP {exc.status_code}: {_message(exc)}", exc.status_code in _RETRYABLE_STATUS
            else:
                self.breaker.record_success()  # the server answered: it is up
                return stream
            self.breaker.record_failure()
            logger.warning("remote tier %s attempt %d failed: %s", self.spec.name, attempt + 1, last)
            if not retry:
                break
            if attempt + 1 < self.attempts:
                self._sleep(self.backoff_s * (2**attempt))
        raise self._unavailable(last)

    def stream_chat(self, messages: list[dict], max_tokens: int, temperature: float, seed: int | None,
                    stop: list[str] | None, cancel: threading.Event, *,
                    prediction: str | None = None,
                    template_vars: Mapping[str, object] | None = None) -> Iterator[str]:
        """Text deltas of the remote answer. Connects eagerly: when the tier cannot start, this
        call raises RemoteUnavailable before an iterator is returned. A failure mid-stream
        raises RemoteUnavailable from the iterator (the text so far has been yielded)."""
        kwargs: dict[str, object] = dict(model=self.spec.model, messages=messages, max_tokens=max_tokens,
                                         temperature=temperature)
        if seed is not None:
            kwargs["seed"] = seed
        if stop:
            kwargs["stop"] = stop
        if prediction is not None:  # Predicted Outputs, passed on as the client sent its text
            kwargs["prediction"] = {"type": "content", "content": prediction}
        if template_vars:  # llama-server's and vLLM's name for a request's chat template variables
            kwargs["extra_body"] = {"chat_template_kwargs": dict(template_vars)}
        stream = self._open(**kwargs)
        return self._deltas(stream, cancel)

    def _deltas(self, stream, cancel: threading.Event) -> Iterator[str]:
        import openai

        thinking = ThoughtTags()  # a thought the server sends apart goes back in its tags, for the split here
        try:
            for chunk in stream:
                if cancel.is_set():
                    break
                for choice in chunk.choices:
                    if choice.delta is not None and (text := thinking.wrap(reasoning_of(choice.delta),
                                                                             choice.delta.content)):
                        yield text
        except (openai.APIError, OSError) as exc:
            self.breaker.record_failure()
            raise self._unavailable(f"the stream broke ({exc})") from None
        finally:
            stream.close()


def _message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc))
