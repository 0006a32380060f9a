"""The server every campaign script fuzzes or loads: the 0.5B model, tiny generations, on loopback.

    with fuzz_target(key="k") as srv: ...   # srv.base_url, srv.app (state.loader.backend.engine)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/x.py` as well as `python -m scripts.x`
    sys.path.insert(0, str(REPO))

from localspec.server import ServerSettings, create_app  # noqa: E402
from tests.server_harness import ServerThread, request, wait_until  # noqa: E402

SMALL_TARGET = "qwen2.5-coder-0.5b-instruct-q4_k_m"


def isolate_home() -> Path:
    """A throwaway LOCALSPEC_HOME (metrics DB, cache, logs) that keeps the real model store."""
    import tempfile

    from localspec.paths import resolve_paths

    os.environ.setdefault("LOCALSPEC_MODELS_DIR", str(resolve_paths().models_dir))
    home = Path(tempfile.mkdtemp(prefix="localspec-campaign-"))
    os.environ["LOCALSPEC_HOME"] = str(home)
    return home


def campaign_settings(key: str, **overrides) -> ServerSettings:
    """The issue's fuzz target: 0.5B, no speculation, 2 slots, 1024 context, max_tokens capped at 8."""
    values = dict(
        target=SMALL_TARGET, mode="off", parallel=2, n_ctx=1024, n_threads=2, max_tokens_cap=8, api_key=key,
        max_queue=4, max_body_bytes=256 * 1024,
    )
    values.update(overrides)
    return ServerSettings(**values)


@contextlib.contextmanager
def campaign_server(settings: ServerSettings, ready_timeout: float = 600) -> Iterator[ServerThread]:
    """A real uvicorn server in this process, returned once /health says the models are loaded."""
    os.environ.setdefault("LOCALSPEC_THREADS", str(settings.n_threads or 2))
    app = create_app(settings)
    with ServerThread(app) as srv:
        srv.app = app
        if not wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=ready_timeout):
            raise RuntimeError(f"the server did not become ready: {request(srv.base_url, 'GET', '/health').text}")
        yield srv


def slots_idle(srv: ServerThread) -> bool:
    eng = srv.app.state.loader.backend.engine
    return all(s.active is None for s in eng.slots) and not eng._pending
