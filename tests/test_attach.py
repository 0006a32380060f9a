"""One shared engine: `serve` announces itself in serve.json; `generate` and `chat` attach to it.

The servers here are the real app and uvicorn on loopback over the scripted tier (tests/fake_tier.py):
no model file is read, so what is asserted is the control flow of attaching, not a model's output.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from localspec import __version__
from localspec.attach.state import ServeState, read_state, state_path, write_state
from localspec.cli import main
from localspec.server import ServerSettings, create_app
from tests.fake_tier import scripted, scripted_app, scripted_backend, scripted_engine, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until


def test_serve_writes_its_state_file_0600_without_the_key_and_removes_it():
    settings = ServerSettings(api_key="sekrit-key-123")
    with ServerThread(scripted_app(settings=settings), announce=settings) as srv:
        path = state_path()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        found = read_state()
        assert found is not None
        assert (found.pid, found.port, found.version, found.keyed) == (os.getpid(), srv.port, __version__, True)
        assert found.url == srv.base_url
        assert "sekrit" not in path.read_text()  # the key stays where it was given
    assert not path.exists()


def test_a_state_file_whose_process_is_gone_is_ignored():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_state(ServeState(pid=int(dead.stdout), host="127.0.0.1", port=8123, version=__version__))
    assert read_state() is None
    write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=8123, version=__version__))
    assert read_state() is not None  # the same file, its process alive: read (the port is probe's check)


def test_a_state_file_others_may_write_is_ignored():
    path = write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=8123, version=__version__))
    path.chmod(0o666)
    assert read_state() is None
    path.write_text("{not json")
    path.chmod(0o600)
    assert read_state() is None


# ---------------------------------------------------------------- attaching


SCRIPT = scripted({"capital of France": "The capital of France is Paris, and Paris is lovely."},
                  default="I do not know.")
TARGET = "scripted-large"


def _backend():
    tier = scripted_tier(model_id=TARGET, script=SCRIPT, draft_script=SCRIPT, mode="draft")
    return scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))


@pytest.fixture
def served():
    """A server as `localspec serve` runs it (announced in serve.json), answering from the scripted pair."""
    settings = ServerSettings(cache=False, router=False)
    with ServerThread(scripted_app(backend=_backend(), settings=settings), announce=settings) as srv:
        yield srv


@pytest.fixture
def loads(monkeypatch):
    """Counts the engines this process loads; each is the scripted pair the server has."""
    from localspec import service

    count = []

    def open_engine(**_kw):
        count.append(1)
        return scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode="draft")

    monkeypatch.setattr(service, "open_engine", open_engine)
    return count


def test_generate_attaches_prints_the_same_text_and_a_stats_line(served, loads, capsys):
    assert main(["generate", "--no-pull", "--local", "What is the capital of France?"]) == 0
    local = capsys.readouterr()
    assert len(loads) == 1
    assert main(["generate", "--no-pull", "What is the capital of France?"]) == 0
    attached = capsys.readouterr()
    assert len(loads) == 1, "generate loaded a model although a server was running"
    assert attached.out == local.out and "Paris" in attached.out
    line = attached.err.strip().splitlines()[-1]
    assert line.startswith("[draft] ") and f"attached to {served.base_url}" in line
    assert "accepted" in line and "tokens/pass" in line  # the server's speculation stats, read from the stream


def test_a_metrics_log_that_fails_is_said_after_the_stats_line_not_glued_to_the_answer(loads, capsys, monkeypatch):
    """The warning was printed before the answer's closing newline: "...Paris.warning: request not logged"."""
    from localspec import metrics

    def broken(*_a, **_kw):
        raise OSError(17, "File exists")

    monkeypatch.setattr(metrics.Metrics, "from_settings", broken)
    assert main(["generate", "--no-pull", "--local", "What is the capital of France?"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("[draft] ") and err[-1].startswith("warning: request not logged to metrics")


def test_generate_json_attached(served, loads, capsys):
    assert main(["generate", "--no-pull", "--json", "What is the capital of France?"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert not loads
    assert record["attached"] == served.base_url and "Paris" in record["text"]
    assert record["stats"]["mode"] == "draft" and record["stats"]["drafted"] > 0
    assert record["stats"]["completion_tokens"] == len(record["text"].encode())  # one token a byte (fake_tier)


def test_origins_arrive_attached(served):
    """Each streamed token's origin travels in the chunk's localspec object: Ctrl+T's colours attached,
    token for token what the same engine in this process gives."""
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Token
    from localspec.tui import RemoteBackend

    request = GenerationRequest(messages=[{"role": "user", "content": "the capital of France?"}], max_tokens=64)
    backend = RemoteBackend(served.base_url)  # as `chat --connect` builds it: it finds out the server is localspec
    try:
        events = list(backend.start(request))
    finally:
        backend.close()
    engine = scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode="draft")
    try:
        here = [(e.text, e.origin) for e in engine.generate(request) if isinstance(e, Token) and e.text]
    finally:
        engine.close()
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop" and done.stats.mode == "draft"
    assert [(e.text, e.origin) for e in events if isinstance(e, Token)] == here
    assert {origin for _, origin in here} == {"draft", "target"}


def test_a_server_with_another_model_is_named_and_the_models_load_here(served, loads, capsys):
    assert main(["generate", "--no-pull", "--model", "other-model", "What is the capital of France?"]) == 0
    out = capsys.readouterr()
    assert len(loads) == 1 and "Paris" in out.out
    assert f"localspec: the server at {served.base_url} serves {TARGET}, not other-model; loading the models here" \
        in out.err.splitlines()


def test_a_wrong_key_is_named_and_the_models_load_here(loads, capsys, monkeypatch):
    settings = ServerSettings(api_key="right-key-123", cache=False, router=False)
    with ServerThread(scripted_app(backend=_backend(), settings=settings), announce=settings) as srv:
        monkeypatch.setenv("LOCALSPEC_API_KEY", "wrong-key-456")
        assert main(["generate", "--no-pull", "What is the capital of France?"]) == 0
        assert f"localspec: the server at {srv.base_url} refused our API key; loading the models here" \
            in capsys.readouterr().err.splitlines()
        assert len(loads) == 1
        monkeypatch.setenv("LOCALSPEC_API_KEY", "right-key-123")
        assert main(["generate", "--no-pull", "What is the capital of France?"]) == 0
        assert len(loads) == 1 and "attached to" in capsys.readouterr().err


def test_a_stale_state_file_is_ignored_without_a_word(loads, capsys):
    """The process is alive (ours) but nothing listens on its port: as if there were no server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=port, version=__version__))
    assert main(["generate", "--no-pull", "What is the capital of France?"]) == 0
    out = capsys.readouterr()
    assert len(loads) == 1 and "localspec:" not in out.err and "Paris" in out.out


# ---------------------------------------------------------------- ps, stop, keep_alive


class Loads:
    """The server's `load`: a fresh scripted pair each time, counted, so an unload and a reload show."""

    def __init__(self) -> None:
        self.engines: list = []

    def __call__(self, _settings):
        tier = scripted_tier(model_id=TARGET, script=SCRIPT, draft_script=SCRIPT, mode="draft")
        self.engines.append(tier.engine)
        return scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))


def _complete(url: str, **extra) -> str:
    r = request(url, "POST", "/v1/completions", json_body={"model": TARGET, "prompt": "the capital of France",
                                                            "max_tokens": 16, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture
def on_demand():
    """A server whose models unload after their keep-alive (default one second) and load on demand."""
    loads = Loads()
    settings = ServerSettings(cache=False, router=False, keep_alive="1s")
    app = create_app(settings=settings, load=loads)
    with ServerThread(app, announce=settings) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=30)
        srv.loads, srv.state = loads, app.state.server
        yield srv


def test_keep_alive_zero_unloads_after_the_request_and_the_next_request_loads_again(on_demand):
    url, loads, state = on_demand.base_url, on_demand.loads, on_demand.state
    first = _complete(url, keep_alive=0)
    # The reaper detaches the models on the event loop (from then on /health and /v1/ps say idle), then
    # closes them on a worker thread under the room lock (a load waits for that close): wait for both,
    # the close being what gives the model's memory back, not just forgets it. The deadline is the
    # harness's, about a hang, not speed: with two busy processes beside it, the test saw idle before
    # the close in 4 and 9 runs of 120.
    assert wait_until(lambda: state.loader.state == "idle" and loads.engines[0].target.closed)
    health = request(url, "GET", "/health")
    assert health.status_code == 200 and health.json()["status"] == "idle"
    ps = request(url, "GET", "/v1/ps").json()
    assert ps["status"] == "idle" and ps["models"] == []
    assert ps["keep_alive_s"] == 0  # the request's 0 was what unloaded them, not the server's default of 1 s
    models = request(url, "GET", "/v1/models").json()["data"]  # the names stay listed, marked unloaded
    assert {m["id"] for m in models} == {TARGET} and models[0]["localspec"]["loaded"] is False
    assert _complete(url) == first  # loaded again on demand, the same answer
    assert len(loads.engines) == 2 and not loads.engines[1].target.closed


def test_the_server_default_keep_alive_unloads_an_idle_server_and_minus_one_keeps_it(on_demand):
    url, state = on_demand.base_url, on_demand.state
    _complete(url, keep_alive="-1")
    ps = request(url, "GET", "/v1/ps").json()
    assert ps["keep_alive_s"] is None and ps["expires_at"] is None
    _complete(url)  # the server default again: one second
    assert wait_until(lambda: state.loader.state == "idle", timeout=10)


def test_the_keep_alive_counts_from_the_end_of_a_load_slower_than_it():
    """The expiry counted from the server's start (or the last request's end), so a load that took longer
    than the keep-alive was unloaded the moment it was done, and the first request loaded it all again.
    A clock the test moves stands for the slow load: ten seconds pass while the load waits, against 1 s."""
    now = [1000.0]
    gate = threading.Event()
    app = scripted_app(pipeline=scripted_pipeline(tiers=[scripted_tier(model_id=TARGET, script=SCRIPT)]), gate=gate,
                       settings=ServerSettings(cache=False, router=False, keep_alive="1s"))
    state = app.state.server
    state.keep_alive.clock = lambda: now[0]
    state.keep_alive.touch()
    with ServerThread(app):
        now[0] += 10.0  # the load takes ten "seconds"
        gate.set()
        assert wait_until(lambda: state.loader.backend is not None)
        # Deadlines about hangs, not speed: the reaper looks every quarter second.
        assert wait_until(lambda: state.keep_alive.expires_at() == now[0] + 1.0, timeout=10)
        assert state.loader.state == "ok"  # still loaded: the second after the load has not passed
        now[0] += 2.0
        assert wait_until(lambda: state.loader.state == "idle", timeout=10)


def test_a_bad_keep_alive_is_a_400_naming_the_forms(on_demand):
    r = request(on_demand.base_url, "POST", "/v1/completions",
                json_body={"model": TARGET, "prompt": "hi", "keep_alive": "soon"})
    assert r.status_code == 400 and "5m" in r.text


def test_ps_json_lists_the_loaded_pair_with_slots_and_expiry(on_demand, capsys):
    _complete(on_demand.base_url, keep_alive="10m")
    assert main(["ps", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["url"] == on_demand.base_url and report["status"] == "ok"
    assert [(m["name"], m["role"]) for m in report["models"]] == [(TARGET, "target"), (f"{TARGET}-draft", "draft")]
    target = report["models"][0]
    assert (target["slots"], target["slots_busy"], target["processor"]) == (2, 0, "100% CPU")
    assert report["keep_alive_s"] == 600 and 590 < report["expires_at"] - time.time() <= 600
    assert main(["ps"]) == 0
    assert TARGET in capsys.readouterr().out


def test_stop_unloads_and_the_next_request_loads_again(on_demand, capsys):
    url, loads, state = on_demand.base_url, on_demand.loads, on_demand.state
    first = _complete(url, keep_alive="-1")
    assert main(["stop", TARGET]) == 0
    assert capsys.readouterr().out.strip() == f"Unloaded {TARGET}."
    assert state.loader.state == "idle" and loads.engines[0].target.closed
    assert main(["stop", TARGET]) == 0 and "was not loaded" in capsys.readouterr().out
    assert main(["stop", "no-such-model"]) == 1
    err = capsys.readouterr().err  # one error line and its fix, as every failure prints
    assert "does not exist" in err and "fix: Name a model the server serves" in err
    assert _complete(url) == first and len(loads.engines) == 2


def test_ps_without_a_server_says_so(capsys):
    assert main(["ps", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["models"] == []
