"""Ollama's model management (/api/pull, /api/delete) and what /api/tags says of installed models:
a real server on loopback, the official `ollama` client, the real model store in a private folder.

The model pulled is a small GGUF the registry overlay pins by sha256, found in the user's model
folder (LOCALSPEC_MODEL_DIRS), so the pull is the store's real one without a network.
"""

from __future__ import annotations

import ollama
import pytest

from localspec.models import ModelManager
from localspec.models.progress import ProgressEvent
from localspec.server import ServerSettings
from localspec.server.model_store import (STEP_EVERY_S, ManagerStore, PullPhase, PullStep, PullSteps, parameter_size,
                                          size_label)
from localspec.server.residents import InstalledModels
from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.gguf_factory import make_gguf
from tests.models_helpers import sha256, tmp_store, write_overlay  # noqa: F401
from tests.server_harness import ServerThread, request

SERVED = "scripted-served"
TINY = "tiny-pullable"


@pytest.fixture
def tiny_in_folder(tmp_path, tmp_store, monkeypatch):  # noqa: F811
    """A tiny chat model the registry pins, in the user's model folder, not yet installed."""
    data = make_gguf(tmp_path / "made.gguf", arch="qwen2").read_bytes()
    folder = tmp_path / "my-models"
    folder.mkdir()
    (folder / "tiny.gguf").write_bytes(data)
    monkeypatch.setenv("LOCALSPEC_MODEL_DIRS", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_overlay(f'[[models]]\nid = "{TINY}"\nrole = "target"\naliases = ["tiny"]\n'
                  '  [[models.sources]]\n  kind = "hf"\n  repo = "nobody/unreachable"\n'
                  '  files = [{ name = "tiny.gguf" }]\n'
                  '  [[models.sources]]\n  kind = "file"\n'
                  f'  files = [{{ name = "tiny.gguf", size = {len(data)}, sha256 = "{sha256(data)}" }}]\n'
                  f'[profiles.tiny-profile]\ntarget = "{TINY}"\n')
    return data


def _server(profile: str | None = None) -> ServerThread:
    tier = scripted_tier(model_id=SERVED, script=lambda prompt: "Hello.")
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))
    settings = ServerSettings(cache=False, router=False, profile=profile)
    app = scripted_app(backend=backend, settings=settings, store=ManagerStore(),
                       models=InstalledModels(None, 1, profile))
    return ServerThread(app)


def test_a_pull_streams_ollamas_progress_lines_then_the_model_is_listed_with_its_facts(tiny_in_folder):
    with _server() as srv:
        client = ollama.Client(host=srv.base_url, timeout=60)
        assert TINY + ":latest" not in [m.model for m in client.list().models]
        lines = list(client.pull(TINY, stream=True))
        statuses = [line.status for line in lines]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
        pinned = sha256(tiny_in_folder)
        downloads = [line for line in lines if line.digest]
        assert downloads and {line.digest for line in downloads} == {f"sha256:{pinned}"}
        assert downloads[-1].completed == downloads[-1].total == len(tiny_in_folder)
        assert downloads[0].status == f"pulling {pinned[:12]}"
        assert "writing manifest" in statuses
        listed = {m.model: m for m in client.list().models}
        tiny = listed[TINY + ":latest"]
        assert tiny.size == len(tiny_in_folder) and tiny.digest == pinned
        assert tiny.details.family == "qwen2" and tiny.details.format == "gguf"
        assert tiny.modified_at.year >= 2026
        shown = client.show(TINY)
        assert shown.details.family == "qwen2"
    assert ModelManager().installed_path(TINY) is not None and ModelManager().verify(TINY)


def test_a_pull_without_stream_answers_once_and_a_second_pull_finds_it_installed(tiny_in_folder):
    with _server() as srv:
        client = ollama.Client(host=srv.base_url, timeout=60)
        assert client.pull("tiny", stream=False).status == "success"  # an alias names it too
        assert client.pull(TINY + ":latest", stream=False).status == "success"  # Ollama's tag is ignored
    assert ModelManager().installed_path(TINY) is not None


def test_an_unknown_model_is_a_404_naming_it_streamed_or_not(tiny_in_folder):
    with _server() as srv:
        client = ollama.Client(host=srv.base_url, timeout=60)
        with pytest.raises(ollama.ResponseError) as whole:
            client.pull("tiny-pulable", stream=False)
        assert whole.value.status_code == 404 and "tiny-pulable" in whole.value.error
        with pytest.raises(ollama.ResponseError) as streamed:  # the error line ends the stream
            list(client.pull("tiny-pulable", stream=True))
        assert "tiny-pulable" in streamed.value.error
        r = request(srv.base_url, "POST", "/api/pull", json_body={"model": "hf.co/"})
        assert r.status_code == 400 and "hf.co/USER/REPO" in r.json()["error"], r.text


def test_a_hub_model_that_cannot_be_reached_fails_with_the_cause_and_the_server_goes_on(tiny_in_folder):
    with _server() as srv:
        r = request(srv.base_url, "POST", "/api/pull", json_body={"model": "hf.co/nobody/nothing:Q4_K_M",
                                                                  "stream": False})
        assert r.status_code == 502 and "HF_HUB_OFFLINE" in r.json()["error"], r.text  # the cause, and the fix
        assert request(srv.base_url, "GET", "/api/tags").status_code == 200


def test_delete_removes_an_installed_model_and_a_second_delete_is_a_404(tiny_in_folder):
    ModelManager().pull(TINY)
    with _server() as srv:
        client = ollama.Client(host=srv.base_url, timeout=60)
        assert client.delete(TINY + ":latest").status == "success"
        assert ModelManager().installed_path(TINY) is None
        assert TINY + ":latest" not in [m.model for m in client.list().models]
        with pytest.raises(ollama.ResponseError) as gone:
            client.delete(TINY)
        assert gone.value.status_code == 404 and "/api/tags" in gone.value.error


def test_delete_leaves_the_profiles_own_models_to_the_server(tiny_in_folder):
    ModelManager().pull(TINY)
    with _server(profile="tiny-profile") as srv:
        r = request(srv.base_url, "DELETE", "/api/delete", json_body={"name": "tiny"})
        assert r.status_code == 409 and "--profile" in r.json()["error"], r.text
    assert ModelManager().installed_path(TINY) is not None


def test_a_server_that_manages_no_store_says_how_to_pull(tiny_in_folder):
    tier = scripted_tier(model_id=SERVED, script=lambda prompt: "Hello.")
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])))
    with ServerThread(app) as srv:
        r = request(srv.base_url, "POST", "/api/pull", json_body={"model": TINY, "stream": False})
        assert r.status_code == 404 and "localspec models pull" in r.json()["error"]
        r = request(srv.base_url, "POST", "/api/push", json_body={"model": TINY})
        assert r.status_code == 404 and "/api/pull" in r.json()["error"]  # the served ones are named


def test_download_steps_are_thinned_but_the_last_always_comes():
    heard: list[PullStep] = []
    now = [0.0]
    steps = PullSteps(heard.append, pinned=lambda mid: "ab" * 32, clock=lambda: now[0])
    for done in range(0, 1001, 10):  # a copy reports every chunk
        steps(ProgressEvent("m", "file", "download", done, 1000))
        now[0] += STEP_EVERY_S / 10
    downloads = [s for s in heard if s.phase is PullPhase.DOWNLOAD]
    assert 5 <= len(downloads) <= 15 and downloads[-1].completed == 1000
    steps(ProgressEvent("m", "file", "verify", 10, 1000))
    steps(ProgressEvent("m", "file", "verify", 1000, 1000))
    steps(ProgressEvent("m", "hf", "failed", message="offline"))
    assert [s.phase for s in heard[len(downloads):]] == [PullPhase.VERIFY, PullPhase.RETRY]
    assert heard[-1].message == "offline"


@pytest.mark.parametrize(("label", "shown"), [("1.5B", "1.5B"), ("23M", "23M"), (None, None), (15, None),
                                              ("", None), ("[bold]" * 10, None), ("1.5B\x1b[2J", None),
                                              (" 1.5B", None)])
def test_a_ggufs_size_label_is_shown_only_when_it_is_a_short_printable_label(label, shown):
    assert size_label(label) == shown


def test_a_parameter_count_is_written_as_ollama_lists_it():
    assert [parameter_size(n) for n in (0, 22_700_000, 494_000_000, 1_777_088_000)] == ["", "23M", "494M", "1.8B"]


def test_delete_waits_for_a_load_in_flight_then_unloads_and_closes_the_model_loaded_on_demand(tiny_in_folder):
    """A delete during an on-demand load answered 200 and dropped the resident: the load landed in a
    model nobody held (never in /api/ps, never unloaded, never closed)."""
    import threading

    from localspec.server import create_app
    from tests.server_harness import wait_until

    ModelManager().pull(TINY)
    gate, closed = threading.Event(), []

    def load(settings):
        if settings.target != TINY:
            return scripted_backend(pipeline=scripted_pipeline(tiers=[scripted_tier(model_id=SERVED,
                                                                                      script=lambda p: "x")]))
        gate.wait(30)
        backend = scripted_backend(pipeline=scripted_pipeline(tiers=[scripted_tier(model_id=TINY,
                                                                                     script=lambda p: "From tiny.")]))
        close = backend.close
        backend.close = lambda drain=False: (closed.append(TINY), close(drain))[1]
        return backend

    app = create_app(settings=ServerSettings(cache=False, router=False), load=load, store=ManagerStore(),
                     models=InstalledModels(None, 1, None))
    state = app.state.server
    with ServerThread(app) as srv:
        answered: dict[str, object] = {}
        asking = threading.Thread(target=lambda: answered.update(r=request(
            srv.base_url, "POST", "/api/chat", json_body={"model": TINY, "stream": False,
                                                          "messages": [{"role": "user", "content": "Hi"}]})))
        asking.start()
        assert wait_until(lambda: TINY in state.extra and state.extra[TINY].loader.loading, timeout=20)
        r = request(srv.base_url, "DELETE", "/api/delete", json_body={"model": TINY})
        assert r.status_code == 409 and "loading" in r.json()["error"], r.text
        gate.set()
        asking.join(30)
        assert answered["r"].status_code == 200 and "From tiny." in answered["r"].text
        assert request(srv.base_url, "DELETE", "/api/delete", json_body={"model": TINY}).status_code == 200
        assert closed == [TINY] and TINY not in state.extra
        assert TINY not in [m["name"] for m in request(srv.base_url, "GET", "/api/ps").json()["models"]]
    assert ModelManager().installed_path(TINY) is None
