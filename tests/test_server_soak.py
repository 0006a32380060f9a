"""What the soak of `serve` (scripts/soak.py) found growing over hours, as counts: no timing, no RSS.

The servers here are the real app and uvicorn over scripted tiers (tests/fake_tier.py): no model file is read.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cache import SemanticCache
from localspec.server import ServerSettings, create_app
from tests.fake_tier import scripted_backend, scripted_pipeline
from tests.server_harness import ServerThread, request, wait_until

MODEL = "scripted-large"


def open_files_under(folder: Path) -> list[str]:
    """This process's open descriptors on files under `folder`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


@pytest.fixture
def no_automatic_gc() -> Iterator[None]:
    """What happens between two full collections, which come at no set time in a server: automatic
    collection is off for the test (an explicit gc.collect() still runs)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts descriptors in /proc/self/fd")
def test_unloading_closes_the_cache_connections_of_every_thread(tmp_path: Path, no_automatic_gc) -> None:
    """diskcache keeps one SQLite connection per thread that used it and closes the closing thread's alone;
    sqlite3 connections sit in reference cycles, so the others (lookups run on the event loop's worker
    threads) kept their descriptors after an unload until a full collection. Every reload opened a new
    set: in the soak, fds grew by about 4 per keep_alive 0 / stop cycle."""
    cache_dir = tmp_path / "semantic"

    def load(_settings: ServerSettings):  # each load opens its cache, as Backend.load does
        return scripted_backend(pipeline=scripted_pipeline(cache=SemanticCache(cache_dir)))

    app = create_app(ServerSettings(max_tokens_cap=8), load=load)
    with ServerThread(app) as srv:
        url = srv.base_url
        assert wait_until(lambda: request(url, "GET", "/health").status_code == 200)
        for cycle in range(3):
            for i in range(6):  # cache lookups on several of the loop's worker threads
                r = request(url, "POST", "/v1/chat/completions", json_body={
                    "model": MODEL, "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": f"cycle {cycle} question {i}"}]})
                assert r.status_code == 200, r.text
            assert open_files_under(cache_dir)  # the cache is open while its models are loaded
            stop = request(url, "POST", "/v1/stop", json_body={"model": MODEL})
            assert stop.status_code == 200 and stop.json()["unloaded"] is True, stop.text
            assert open_files_under(cache_dir) == []


def test_an_unload_hands_the_freed_memory_back(monkeypatch) -> None:
    """llama.cpp's freed buffers stayed in malloc's arenas: an unloaded server kept ~100 MB more per
    unload/reload cycle of the 0.5B model (scripts/soak.py). Every unload releases, once."""
    from localspec.server import state as state_module

    released: list[int] = []
    monkeypatch.setattr(state_module, "release_memory", lambda: released.append(1))

    class Closing:
        def close(self, drain: bool = False) -> None:
            pass

    state_module.close_all([Closing(), Closing()])  # type: ignore[list-item]
    state_module.close_all([])
    assert released == [1, 1]
