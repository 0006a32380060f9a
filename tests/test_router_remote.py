"""The remote tier against a second localspec server on loopback (real HTTP, the official client):
an answer while it runs, then RemoteUnavailable and the circuit opening once it is stopped.

The server answers from a scripted model (tests/fake_tier.py): what is tested is the client's
control flow, not what a model says."""

from __future__ import annotations

import threading

import pytest

from localspec.errors import ConfigError
from localspec.router import CircuitBreaker, RemoteTier, RemoteUnavailable, TierSpec
from localspec.server import ServerSettings
from tests.fake_tier import scripted, scripted_app, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

KEY = "remote-tier-key"
KEY_ENV = "LOCALSPEC_TEST_REMOTE_KEY"
MODEL = "scripted-remote"
SCRIPT = scripted({"Count from 1 to 50": " ".join(str(i) for i in range(1, 51))}, default="hello")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def spec(base_url: str, **kw) -> TierSpec:
    return TierSpec("remote", "remote", base_url=base_url, model=kw.pop("model", MODEL),
                    api_key_env=kw.pop("api_key_env", KEY_ENV), timeout_s=kw.pop("timeout_s", 120.0))


def test_remote_tier_answers_then_fails_over_and_opens_the_circuit(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    settings = ServerSettings(api_key=KEY, parallel=1, max_tokens_cap=64)
    pipeline = scripted_pipeline(tiers=[scripted_tier(name="large", model_id=MODEL, script=SCRIPT, parallel=1)])
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=60, clock=clock)
    sleeps: list[float] = []
    messages = [{"role": "user", "content": "Reply with the word: hello"}]
    with ServerThread(scripted_app(pipeline=pipeline, settings=settings)) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        tier = RemoteTier(spec(f"{srv.base_url}/v1"), breaker, attempts=2, backoff_s=0.25, sleep=sleeps.append)
        tier.check()
        text = "".join(tier.stream_chat(messages, 16, 0.0, 1, None, threading.Event()))
        assert text.strip() and breaker.state == "closed"

        # Cancelling mid-stream stops reading (the rest of the answer is not awaited).
        cancel = threading.Event()
        deltas = tier.stream_chat([{"role": "user", "content": "Count from 1 to 50."}], 64, 0.0, 1, None, cancel)
        first = next(deltas)
        cancel.set()
        assert first and len(list(deltas)) == 0

        # A wrong model name is the server's 404: not retried, reported as unavailable.
        bad = RemoteTier(spec(f"{srv.base_url}/v1", model="no-such-model"), CircuitBreaker(clock=clock),
                         attempts=3, sleep=sleeps.append)
        with pytest.raises(RemoteUnavailable, match="HTTP 404"):
            bad.stream_chat(messages, 8, 0.0, None, None, threading.Event())
        assert sleeps == []
        base_url = srv.base_url
    # The server is gone: both attempts fail (with one backoff between them), the breaker opens.
    with pytest.raises(RemoteUnavailable) as err:
        tier.stream_chat(messages, 8, 0.0, None, None, threading.Event())
    assert "connection failed" in err.value.cause and base_url in err.value.cause
    assert sleeps == [0.25]
    assert breaker.state == "open"
    # While open, calls are refused without touching the network.
    with pytest.raises(RemoteUnavailable, match="circuit open"):
        tier.stream_chat(messages, 8, 0.0, None, None, threading.Event())
    assert sleeps == [0.25]
    # After the cooldown one trial goes out; it fails again and the circuit reopens.
    clock.now += 60
    assert breaker.state == "half_open"
    with pytest.raises(RemoteUnavailable, match="connection failed"):
        tier.stream_chat(messages, 8, 0.0, None, None, threading.Event())
    assert breaker.state == "open"


def test_remote_tier_start_up_validation(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=KEY_ENV):
        RemoteTier(spec("http://127.0.0.1:9/v1")).check()
    monkeypatch.setenv(KEY_ENV, "x")
    RemoteTier(spec("http://127.0.0.1:9/v1")).check()
    with pytest.raises(ConfigError, match="not an http"):
        RemoteTier(spec("ftp://example/v1")).check()
    with pytest.raises(ConfigError, match="no model"):
        RemoteTier(spec("http://127.0.0.1:9/v1", model="")).check()
    with pytest.raises(ValueError):
        RemoteTier(TierSpec("small", "local", target=MODEL))
