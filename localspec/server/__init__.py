"""The OpenAI-compatible HTTP endpoint (`localspec serve`)."""

import asyncio
import math
import sys
from typing import Any

from fastapi import FastAPI

from localspec.server.announce import AnnouncingServer
from localspec.server.app import create_app
from localspec.server.backend import Backend
from localspec.server.settings import API_KEY_ENV, ServerSettings, is_loopback

__all__ = ["API_KEY_ENV", "Backend", "ServerSettings", "create_app", "is_loopback", "make_server", "protocol_for",
           "serve"]


SHUTDOWN_GRACE_S = 10.0  # running requests get this long to finish on shutdown; the rest are cancelled
# ...and then this long to send their cancellation (the engine ends them at its next step) before uvicorn
# cuts what is left: its cut leaves a stream without an end and a whole answer a bare 500.
SHUTDOWN_END_S = 5.0


def protocol_for(settings: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's head and a cap on connections."""
    from localspec.server.connections import ConnectionLimits, default_max_connections, guarded_protocol

    return guarded_protocol(ConnectionLimits(request_timeout_s=settings.request_timeout_s,
                                             max_connections=settings.max_connections or default_max_connections()))


def serve(settings: ServerSettings) -> None:
    """Run the app under uvicorn until interrupted. Refuses an unauthenticated non-loopback bind."""
    from uvicorn.main import STARTUP_FAILURE

    settings = settings.with_env_key()
    settings.check_bind()
    server = make_server(settings, create_app(settings))
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl+C during shutdown
        pass
    finally:
        server.withdraw()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # uvicorn.run's status for a failed start (the port taken, say)


def make_server(settings: ServerSettings, app: FastAPI, *, grace_s: float = SHUTDOWN_GRACE_S) -> AnnouncingServer:
    """`serve`'s uvicorn server for `app` on the settings' address; it writes serve.json while it
    listens (faces attach through it). At shutdown, requests still running after `grace_s` are
    cancelled, and answer so."""
    import uvicorn

    from localspec.server.state import ServerState

    tls: dict[str, Any] = {}
    if settings.ssl_certfile:
        tls = {"ssl_certfile": str(settings.ssl_certfile), "ssl_keyfile": str(settings.ssl_keyfile)}
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            timeout_graceful_shutdown=math.ceil(grace_s + SHUTDOWN_END_S), http=protocol_for(settings),
                            **tls)
    state: ServerState = app.state.server
    return AnnouncingServer(config, settings, end_running=state.cancel_running, grace_s=grace_s)
