"""uvicorn's server, announcing itself in `serve.json` (localspec.attach.state) while it listens, and
ending the answers still running at shutdown as answers."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from localspec import __version__
from localspec.attach.state import ServeState, remove_state, write_state
from localspec.server.settings import ServerSettings

logger = logging.getLogger(__name__)


class AnnouncingServer(uvicorn.Server):
    """Writes the state file once its socket is bound (the real port, even with `--port 0`) and
    removes it when it shuts down cleanly.

    `end_running`, `grace_s`: at shutdown, answers still running after `grace_s` are cancelled through
    `end_running`, so each still answers (its 503, a stream's error event and [DONE]) while uvicorn's own
    timeout, which cuts the connections without a word, is further off."""

    def __init__(self, config: uvicorn.Config, settings: ServerSettings, *,
                 end_running: Callable[[], None] | None = None, grace_s: float = 0.0) -> None:
        super().__init__(config)
        self.settings = settings
        self.announced: ServeState | None = None
        self.end_running = end_running
        self.grace_s = grace_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit or not self.servers:
            return  # the bind failed: nothing to announce
        state = state_for(self.settings, bound_port(self.servers))
        try:
            write_state(state)
        except OSError as exc:  # faces then find the server by its port; serving goes on
            logger.warning("could not write the server state file: %s", exc)
            return
        self.announced = state  # set once the file is there: what a waiting caller looks for

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.withdraw()
        ending = asyncio.create_task(self._end_after_grace()) if self.end_running is not None else None
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if ending is not None:
                ending.cancel()

    async def _end_after_grace(self) -> None:
        await asyncio.sleep(self.grace_s)
        assert self.end_running is not None
        logger.info("cancelling the requests still running %g s after the shutdown began", self.grace_s)
        self.end_running()

    def withdraw(self) -> None:
        if self.announced is not None:
            remove_state(self.announced.pid)
            self.announced = None


def bound_port(servers: list[Any]) -> int:
    return int(servers[0].sockets[0].getsockname()[1])


def state_for(s: ServerSettings, port: int) -> ServeState:
    return ServeState(
        pid=os.getpid(), host=s.host, port=port, version=__version__,
        scheme="https" if s.ssl_certfile else "http", profile=s.profile, target=s.target, draft=s.draft,
        keyed=bool(s.keys()), api_key_file=str(s.api_key_file.resolve()) if s.api_key_file else None,
    )
