"""Finding the server a face attaches to, and deciding whether it may.

The order: the state file `serve` writes (its port, its key file), else the default port on
127.0.0.1. A candidate must answer `/health` as localspec with a version before any prompt is sent
to it. Nothing listening there (a stale file, no server) is passed over without a word; another
program answering on the port, or a localspec server that cannot take the request (another model
or profile, our key refused, its models failed to load), is reported in one line: the face then
loads in-process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localspec.attach.state import read_state
from localspec.errors import LocalspecError

DEFAULT_PORT = 8000  # `localspec serve`'s default (ServerSettings.port)
API_KEY_ENV = "LOCALSPEC_API_KEY"  # as localspec.server.settings (not imported: it pulls in the server)
PROBE_TIMEOUT_S = 2.0
LOAD_WAIT_S = 600.0  # a server still loading its models at start-up: wait this long for it


class _Health(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: str = Field(max_length=16)
    server: str = Field(max_length=32)
    version: str = Field(min_length=1, max_length=64)
    detail: str | None = Field(None, max_length=2000)


class _Card(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(max_length=512)
    localspec: dict[str, Any] | None = None


class _Cards(BaseModel):
    model_config = ConfigDict(extra="ignore")

    data: list[_Card] = Field(max_length=4096)


@dataclass(frozen=True)
class Server:
    """A localspec server that answered, with the key it took and the names it serves."""

    url: str
    version: str
    key: str | None
    names: frozenset[str]
    target: str | None
    profile: str | None


@dataclass(frozen=True)
class LoadHere:
    """Load in-process. `reason`: why a server that was found is not used (None: there is none)."""

    reason: str | None = None


@dataclass(frozen=True)
class Want:
    """What the face was asked for: only what is given must match the server's."""

    model: str | None = None
    profile: str | None = None
    api_key: str | None = None


_MAX_REPLY = 4 << 20  # a probe reads at most this much of a reply


def get(url: str, *, headers: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, bytes]:
    """One GET: (status, body). Never through $HTTP_PROXY: the server is this machine's. Raises OSError."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(_MAX_REPLY)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(_MAX_REPLY)


class NoHealth(Enum):
    """Why `/health` did not answer as localspec."""

    NOTHING = "nothing answers"  # refused, reset, timed out: no server (or a stale state file)
    FOREIGN = "another program answers"  # an HTTP reply that is not localspec's /health


def ask_health(url: str) -> _Health | NoHealth:
    """`/health` if it answers as localspec (200 ready, 503 loading or failed), else why not."""
    try:
        status, body = get(f"{url}/health")
        found = _Health.model_validate_json(body) if status in (200, 503) else None
    except ValidationError:
        return NoHealth.FOREIGN
    except (OSError, ValueError):  # nothing there (refused, reset, timed out), or a URL that is not one
        return NoHealth.NOTHING
    return found if found is not None and found.server == "localspec" else NoHealth.FOREIGN


def health(url: str) -> _Health | None:
    """`/health` if it answers as localspec, else None."""
    found = ask_health(url)
    return found if isinstance(found, _Health) else None


def _key(want: Want, key_file: str | None) -> str | None:
    """The key to send: the face's own, $LOCALSPEC_API_KEY, else the first in the server's key file."""
    if want.api_key or os.environ.get(API_KEY_ENV):
        return want.api_key or os.environ[API_KEY_ENV]
    if key_file:
        from localspec.server.settings import read_key_file

        return read_key_file(Path(key_file))[0]  # refuses a file others can read (ConfigError)
    return None


def _wait_while_loading(url: str, first: _Health, say: Callable[[str], None]) -> _Health | None:
    found: _Health | None = first
    if first.status == "loading":
        say(f"localspec: the server at {url} is loading its models; waiting for it")
    deadline = time.monotonic() + LOAD_WAIT_S
    while found is not None and found.status == "loading" and time.monotonic() < deadline:
        time.sleep(0.5)
        found = health(url)
    return found


def find_server(want: Want, *, say: Callable[[str], None] = lambda _: None) -> Server | LoadHere:
    """The running server to attach to, or why not. `say` hears a progress line (waiting for a load)."""
    state = read_state()
    url = state.url if state else f"http://127.0.0.1:{DEFAULT_PORT}"
    first = ask_health(url)
    if first is NoHealth.NOTHING:
        return LoadHere()  # no server, or a stale file
    if isinstance(first, NoHealth):  # never sent a prompt: it may be anything
        return LoadHere(f"{url} answers, but not as localspec (no localspec version in its /health), "
                        "so nothing is sent there")
    found = _wait_while_loading(url, first, say)
    if found is None or found.status == "loading":
        return LoadHere(f"the server at {url} did not finish loading its models")
    if found.status == "error":
        return LoadHere(f"the server at {url} failed to load its models ({found.detail or 'no detail'})")
    try:
        key = _key(want, state.api_key_file if state else None)
    except LocalspecError as exc:
        return LoadHere(f"the server at {url} wants an API key, and its key file is unusable: {exc.cause}")
    return _check(url, found.version, key, want)


def _check(url: str, version: str, key: str | None, want: Want) -> Server | LoadHere:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        status, body = get(f"{url}/v1/models", headers=headers, timeout=PROBE_TIMEOUT_S * 5)
    except (OSError, ValueError) as exc:
        return LoadHere(f"the server at {url} did not list its models ({type(exc).__name__})")
    if status == 401:
        return LoadHere(f"the server at {url} refused our API key" if key else
                        f"the server at {url} wants an API key (set ${API_KEY_ENV})")
    try:
        cards = _Cards.model_validate_json(body).data if status == 200 else None
    except ValidationError:
        cards = None
    if cards is None:
        return LoadHere(f"the server at {url} did not list its models (HTTP {status})")
    chat = [c for c in cards if (c.localspec or {}).get("role", "chat") == "chat"]
    names = frozenset(c.id for c in chat)
    meta = next((c.localspec for c in chat if c.localspec and c.localspec.get("target")), None) or {}
    target = meta.get("target") if isinstance(meta.get("target"), str) else None
    profile = meta.get("profile") if isinstance(meta.get("profile"), str) else None
    if want.model and want.model not in names:
        return LoadHere(f"the server at {url} serves {target or ', '.join(sorted(names))}, not {want.model}")
    if want.profile and not want.model and want.profile != profile:
        return LoadHere(f"the server at {url} runs profile {profile or '?'}, not {want.profile}")
    return Server(url=url, version=version, key=key, names=names, target=target, profile=profile)
