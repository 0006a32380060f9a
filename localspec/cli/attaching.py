"""The faces' side of one shared engine: attach to a running `localspec serve`, or say why not.

`generate` and `chat` call `attach_or_local` before loading anything. No server: silence, and the
models load in-process as before. A server that cannot take the request: one line on stderr
saying why, then the in-process load (never a silent fallback).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localspec.attach.probe import Server

LOCAL_HELP = "load the models in this process even when a `localspec serve` is running"


def attach_or_local(*, model: str | None, profile: str | None, api_key: str | None = None, local: bool = False,
                    blockers: Sequence[str] = (), say: Callable[[str], None] | None = None) -> Server | None:
    """The server to attach to, or None to load in-process. `blockers`: why this invocation needs an
    engine of its own (flags a server cannot honour), said if a server is found. `say` hears the
    one-line reasons (default: stderr; the chat app, whose screen stderr would break, logs them)."""
    if local:
        return None
    from localspec.attach.probe import Server, Want, find_server

    say = say or _stderr
    found = find_server(Want(model=model, profile=profile, api_key=api_key), say=say)
    if isinstance(found, Server):
        if blockers:
            say(f"localspec: not attaching to the server at {found.url}: {blockers[0]}; loading the models here")
            return None
        return found
    if found.reason:
        say(f"localspec: {found.reason}; loading the models here")
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
