"""The OpenAI-compatible HTTP endpoint (`localspec serve`)."""

import asyncio
import sys
from typing import Any

from localspec.server.announce import AnnouncingServer
from localspec.server.app import create_app
from localspec.server.backend import Backend
from localspec.server.settings import API_KEY_ENV, ServerSettings, is_loopback

__all__ = ["API_KEY_ENV", "Backend", "ServerSettings", "create_app", "is_loopback", "protocol_for", "serve"]


def protocol_for(settings: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's head and a cap on connections."""
    from localspec.server.connections import ConnectionLimits, default_max_connections, guarded_protocol

    return guarded_protocol(ConnectionLimits(request_timeout_s=settings.request_timeout_s,
                                             max_connections=settings.max_connections or default_max_connections()))


def serve(settings: ServerSettings) -> None:
    """Run the app under uvicorn until interrupted. Refuses an unauthenticated non-loopback bind."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    settings = settings.with_env_key()
    settings.check_bind()
    app = create_app(settings)
    # Running requests get this long to finish on shutdown; the rest are cancelled.
    tls: dict[str, Any] = {}
    if settings.ssl_certfile:
        tls = {"ssl_certfile": str(settings.ssl_certfile), "ssl_keyfile": str(settings.ssl_keyfile)}
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            timeout_graceful_shutdown=10, http=protocol_for(settings), **tls)
    server = AnnouncingServer(config, settings)  # writes serve.json while it listens: faces attach through it
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl+C during shutdown
        pass
    finally:
        server.withdraw()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # uvicorn.run's status for a failed start (the port taken, say)
