"""The OpenAI-compatible HTTP endpoint (`localspec serve`)."""

from typing import Any

from localspec.server.app import create_app
from localspec.server.backend import Backend
from localspec.server.settings import API_KEY_ENV, ServerSettings, is_loopback

__all__ = ["API_KEY_ENV", "Backend", "ServerSettings", "create_app", "is_loopback", "serve"]


def serve(settings: ServerSettings) -> None:
    """Run the app under uvicorn until interrupted. Refuses an unauthenticated non-loopback bind."""
    import uvicorn

    settings = settings.with_env_key()
    settings.check_bind()
    app = create_app(settings)
    # Running requests get this long to finish on shutdown; the rest are cancelled.
    tls: dict[str, Any] = {}
    if settings.ssl_certfile:
        tls = {"ssl_certfile": str(settings.ssl_certfile), "ssl_keyfile": str(settings.ssl_keyfile)}
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=10, **tls)
