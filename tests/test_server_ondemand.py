"""Models on demand in `serve` (#29): a request naming an installed model loads it beside the profile's;
idle models unload least recently used first when RAM is short, never one with a request in flight;
keep_alive, `ps` and `stop` are per model; /v1/models marks what is loaded.

The servers here are the real app and uvicorn over scripted tiers (tests/fake_tier.py) with fake
installed models and fake memory figures: no model file is read.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from localspec.cli import main
from localspec.server import ServerSettings, create_app
from localspec.server.residents import Held, InstalledModel, MemoryFigures, NoRoom, Room, plan_room
from tests.fake_tier import scripted, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

GB = 1_000_000_000
PRIMARY, B, C = "scripted-primary", "model-b", "model-c"


# ---------------------------------------------------------------- room planning (pure)


def _held(key: str, gb: float, last_used: float, busy: bool = False) -> Held:
    return Held(key, int(gb * GB), busy, last_used)


def test_a_model_that_fits_evicts_nothing():
    plan = plan_room(GB, MemoryFigures(available=8 * GB, total=16 * GB), [_held("p", 1, 1.0)])
    assert plan == Room(())


def test_idle_models_unload_least_recently_used_first_and_only_as_many_as_needed():
    held = [_held("new", 1, 3.0), _held("old", 1, 1.0), _held("mid", 1, 2.0)]
    # 3.5 GB total, 3 GB held: room for a 1 GB model appears once two are gone ((3.5 - 1) * 0.9 >= 1).
    plan = plan_room(GB, MemoryFigures(available=10 * GB, total=int(3.5 * GB)), held)
    assert plan == Room(("old",))
    plan = plan_room(2 * GB, MemoryFigures(available=10 * GB, total=int(3.5 * GB)), held)
    assert plan == Room(("old", "mid"))


def test_free_ram_bounds_the_room_as_well_as_total_ram():
    # Plenty of total RAM, little available (other processes hold it): the idle model goes.
    plan = plan_room(GB, MemoryFigures(available=GB // 2, total=64 * GB), [_held("p", 1, 1.0)])
    assert plan == Room(("p",))


def test_a_model_with_requests_in_flight_is_never_evicted():
    held = [_held("busy-old", 1, 1.0, busy=True), _held("idle-new", 1, 2.0)]
    plan = plan_room(GB, MemoryFigures(available=10 * GB, total=int(2.5 * GB)), held)
    assert plan == Room(("idle-new",))  # the least recently used is busy: the next one goes instead
    plan = plan_room(GB, MemoryFigures(available=10 * GB, total=int(1.5 * GB)), held)
    assert isinstance(plan, NoRoom) and plan.busy == ("busy-old",)


# ---------------------------------------------------------------- the server


class Loads:
    """The server's `load`: a scripted model for whatever the settings name (the profile's: PRIMARY),
    each answering with its own name, kept by id so a test can see which were closed."""

    def __init__(self) -> None:
        self.engines: dict[str, list] = {}
        self.gates: dict[str, threading.Event] = {}  # a model's load waits for its gate
        self.settings: dict[str, ServerSettings] = {}  # each model's last load's settings

    def __call__(self, settings: ServerSettings):
        mid = settings.target or PRIMARY
        self.settings[mid] = settings
        if mid in self.gates:
            self.gates[mid].wait(30)
        tier = scripted_tier(model_id=mid, script=scripted(default=f"This is {mid}."))
        self.engines.setdefault(mid, []).append(tier.engine)
        return scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))

    def last(self, mid: str):
        return self.engines[mid][-1]


class FakeModels:
    """Installed models with their memory estimates; each also answers to `<id>-alias`."""

    def __init__(self, sizes: dict[str, int], drafts: dict[str, str] | None = None) -> None:
        self.sizes = sizes
        self.drafts = drafts or {}  # target -> the draft the registry pairs with it
        self.finds = 0  # store look-ups made

    def installed(self) -> list[InstalledModel]:
        return [InstalledModel(m, frozenset({m, f"{m}-alias"})) for m in self.sizes]

    def find(self, name: str) -> InstalledModel | None:
        self.finds += 1
        return next((m for m in self.installed() if name in m.names), None)

    def need_bytes(self, model_id: str) -> int:
        return self.sizes.get(model_id, 0)

    def path_of(self, model_id: str) -> None:
        return None

    def draft_for(self, model_id: str) -> str | None:
        return self.drafts.get(model_id)


class Memory:
    """Fake RAM figures a test can change."""

    def __init__(self, total: int, available: int = 100 * GB) -> None:
        self.figures = MemoryFigures(available=available, total=total)

    def __call__(self) -> MemoryFigures:
        return self.figures


@pytest.fixture
def jit():
    """A server whose profile serves PRIMARY, with B and C installed (1 GB each) and RAM for two of them."""
    loads, memory = Loads(), Memory(total=int(2.5 * GB))
    models = FakeModels({PRIMARY: GB, B: GB, C: GB, "huge": 40 * GB})
    settings = ServerSettings(cache=False, router=False)
    app = create_app(settings=settings, load=loads, models=models, memory=memory)
    with ServerThread(app, announce=settings) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=30)
        srv.loads, srv.memory, srv.state, srv.models = loads, memory, app.state.server, models
        yield srv


def _ask(url: str, model: str, **extra):
    return request(url, "POST", "/v1/completions",
                   json_body={"model": model, "prompt": "who are you", "max_tokens": 64, "temperature": 0, **extra})


def _text(url: str, model: str, **extra) -> str:
    r = _ask(url, model, **extra)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _cards(url: str) -> dict[str, dict]:
    return {m["id"]: m["localspec"] for m in request(url, "GET", "/v1/models").json()["data"]}


def test_a_request_naming_an_installed_model_loads_it_beside_the_profiles(jit):
    url = jit.base_url
    cards = _cards(url)
    assert cards[PRIMARY]["loaded"] is True and cards[PRIMARY]["on_demand"] is False
    assert cards[B]["loaded"] is False and cards[B]["on_demand"] is True and cards[B]["role"] == "chat"
    assert _text(url, f"{B}-alias") == f"This is {B}."  # an alias loads it too
    assert _text(url, PRIMARY) == f"This is {PRIMARY}."  # both loaded at once
    cards = _cards(url)
    assert cards[B]["loaded"] is True and cards[PRIMARY]["loaded"] is True and cards[C]["loaded"] is False
    assert len(jit.loads.engines[PRIMARY]) == 1 and len(jit.loads.engines[B]) == 1
    assert _text(url, B) == f"This is {B}."  # loaded once, used again


def test_the_least_recently_used_idle_model_unloads_to_make_room(jit):
    url, loads = jit.base_url, jit.loads
    _text(url, B)
    _text(url, PRIMARY)  # now B is the least recently used
    _text(url, C)
    assert loads.last(B).target.closed and not loads.last(PRIMARY).target.closed
    assert {m: c["loaded"] for m, c in _cards(url).items() if m in (PRIMARY, B, C)} == {
        PRIMARY: True, B: False, C: True}
    assert _text(url, B) == f"This is {B}."  # B loads again on demand; now PRIMARY was least recently used
    assert loads.last(PRIMARY).target.closed and len(loads.engines[B]) == 2


def test_a_model_with_a_request_in_flight_is_not_unloaded_for_another(jit):
    url, loads, state = jit.base_url, jit.loads, jit.state
    _text(url, B)
    held = loads.last(B).target
    held.running.clear()  # B's next request stays in its slot until released
    got: list = []
    t = threading.Thread(target=lambda: got.append(_ask(url, B)))
    t.start()
    try:
        assert wait_until(lambda: state.extra[B].busy() and state.admission.unfinished() == 1, timeout=10)
        _text(url, PRIMARY)  # B is least recently used, but busy
        assert _text(url, C) == f"This is {C}."
        assert loads.last(PRIMARY).target.closed and not held.closed
        # RAM for B alone: unloading idle C would not make room for PRIMARY while B is busy.
        jit.memory.figures = MemoryFigures(available=100 * GB, total=int(1.5 * GB))
        r = _ask(url, PRIMARY)
        assert r.status_code == 503 and r.json()["error"]["code"] == "insufficient_memory"
        assert B in r.json()["error"]["message"] and "retry" in r.json()["error"]["message"]
        assert r.headers["Retry-After"]
        assert not loads.last(C).target.closed  # nothing is unloaded for a load that cannot happen
    finally:
        held.running.set()
        t.join(30)
    assert got and got[0].status_code == 200 and got[0].json()["choices"][0]["text"] == f"This is {B}."


def test_a_model_too_large_for_this_machine_is_a_503_naming_the_fix(jit):
    r = _ask(jit.base_url, "huge")
    assert r.status_code == 503 and r.json()["error"]["code"] == "insufficient_memory"
    assert "40.0 GB" in r.json()["error"]["message"] and "smaller quant" in r.json()["error"]["message"]
    assert "huge" not in jit.loads.engines and not jit.loads.last(PRIMARY).target.closed


def test_an_unknown_model_is_still_a_404(jit):
    r = _ask(jit.base_url, "no-such-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert request(jit.base_url, "GET", "/v1/models/no-such-model").status_code == 404
    assert request(jit.base_url, "GET", f"/v1/models/{B}").status_code == 200


def test_one_models_card_is_the_lists_and_a_hub_name_is_looked_up(jit):
    """A name with slashes (hf.co/USER/REPO:QUANT) was a bare route 404, and a card had localspec null."""
    listed = {card["id"]: card for card in request(jit.base_url, "GET", "/v1/models").json()["data"]}
    for name in (PRIMARY, B):
        card = request(jit.base_url, "GET", f"/v1/models/{name}").json()
        assert card == listed[name] and card["localspec"] is not None, card
    r = request(jit.base_url, "GET", "/v1/models/hf.co/someone/Some-Model-GGUF:Q4_K_M")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_keep_alive_is_per_model(jit):
    url, loads, state = jit.base_url, jit.loads, jit.state
    _text(url, PRIMARY, keep_alive="-1")
    _text(url, B, keep_alive=0)
    # Unloading detaches the backend on the event loop, then closes it on a worker thread: wait for both.
    assert wait_until(lambda: state.extra[B].loader.backend is None and loads.last(B).target.closed, timeout=10)
    assert state.loader.backend is not None


def test_ps_shows_each_model_with_its_own_expiry_and_stop_unloads_one(jit, capsys):
    url, loads = jit.base_url, jit.loads
    _text(url, PRIMARY, keep_alive="-1")
    _text(url, B, keep_alive="10m")
    assert main(["ps", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_name = {m["name"]: m for m in report["models"]}
    assert set(by_name) == {PRIMARY, B}
    assert by_name[PRIMARY]["keep_alive_s"] is None and by_name[PRIMARY]["expires_at"] is None
    assert by_name[PRIMARY]["on_demand"] is False and by_name[B]["on_demand"] is True
    assert by_name[B]["keep_alive_s"] == 600 and 590 < by_name[B]["expires_at"] - time.time() <= 600
    assert by_name[B]["processor"] == "100% CPU"
    assert main(["ps"]) == 0
    out = capsys.readouterr().out
    assert "Forever" in out and "minutes from now" in out
    assert main(["stop", B]) == 0 and capsys.readouterr().out.strip() == f"Unloaded {B}."
    assert loads.last(B).target.closed and not loads.last(PRIMARY).target.closed
    assert main(["stop", C]) == 0 and "was not loaded" in capsys.readouterr().out  # installed, never loaded
    assert main(["stop", "no-such-model"]) == 1 and "does not exist" in capsys.readouterr().err


def test_ps_names_a_model_loading_on_demand_and_its_requests_wait_for_one_load(jit, capsys):
    url, loads = jit.base_url, jit.loads
    loads.gates[B] = threading.Event()
    got: list = []
    threads = [threading.Thread(target=lambda name=name: got.append(_ask(url, name))) for name in (B, f"{B}-alias")]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: request(url, "GET", "/v1/ps").json()["loading"] == [B], timeout=10)
        assert main(["ps"]) == 0 and f"Loading on demand: {B}." in capsys.readouterr().out
    finally:
        loads.gates[B].set()
        for t in threads:
            t.join(30)
    assert [r.status_code for r in got] == [200, 200]  # both waited for the load rather than getting a 503
    assert len(loads.engines[B]) == 1 and request(url, "GET", "/v1/ps").json()["loading"] == []


def test_shutdown_closes_the_models_loaded_on_demand_too():
    loads = Loads()
    app = create_app(ServerSettings(cache=False, router=False), load=loads, models=FakeModels({B: GB}),
                     memory=Memory(total=64 * GB))
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=30)
        _text(srv.base_url, B)
    assert loads.last(B).target.closed and loads.last(PRIMARY).target.closed


# ---------------------------------------------------------------- fixes after review: holds, stop, retries


def test_a_model_with_a_loading_one_beside_it_counts_that_ones_memory_as_taken():
    # 2 GB available now, but a 1.5 GB model is still loading: it is not in `available` yet, and
    # a loading model cannot be evicted, so a 1 GB model does not fit.
    loading = Held("loading", int(1.5 * GB), False, 1.0, loading=True)
    plan = plan_room(GB, MemoryFigures(available=2 * GB, total=64 * GB), [loading])
    assert isinstance(plan, NoRoom) and plan.busy == ("loading",)
    assert plan_room(GB // 4, MemoryFigures(available=2 * GB, total=64 * GB), [loading]) == Room(())  # (2 - 1.5) * 0.9


def test_the_first_estimate_of_a_model_loaded_on_demand_counts_its_paired_draft():
    """B (1 GB) pairs with a 1 GB draft: 2 GB do not fit beside the profile's 1 GB in 2.5 GB."""
    loads, memory = Loads(), Memory(total=int(2.5 * GB))
    models = FakeModels({PRIMARY: GB, B: GB, "b-draft": GB}, drafts={B: "b-draft"})
    app = create_app(ServerSettings(cache=False, router=False), load=loads, models=models, memory=memory)
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=30)
        assert _text(srv.base_url, B) == f"This is {B}."
        assert loads.last(PRIMARY).target.closed  # without the draft, 1 GB would have fit beside it


def test_closing_unloaded_models_goes_on_past_one_that_fails():
    from localspec.server.state import close_all

    class Closing:
        def __init__(self, fails: bool) -> None:
            self.fails, self.closed = fails, False

        def close(self, drain: bool = False) -> None:
            self.closed = True
            if self.fails:
                raise RuntimeError("close failed")

    backends = [Closing(True), Closing(False)]
    close_all(backends)  # type: ignore[arg-type]
    assert [b.closed for b in backends] == [True, True]


def test_store_only_imports_are_not_offered_on_demand(monkeypatch):
    """A load resolves its target through the registry: a model only the store knows cannot load."""
    from types import SimpleNamespace

    from localspec.errors import LocalspecError
    from localspec.server.residents import InstalledModels

    class Store:
        def list(self, with_fit: bool = True):
            return [SimpleNamespace(id="imported", aliases=[], installed=True, role="?"),
                    SimpleNamespace(id="known", aliases=["k"], installed=True, role="target")]

        def resolve(self, name: str):
            if name in ("known", "k"):
                return SimpleNamespace(id="known", role="target", aliases=["k"], settings=None)
            raise LocalspecError(f"unknown model {name}")

        def installed_path(self, mid: str):
            return f"/models/{mid}.gguf"

    monkeypatch.setattr("localspec.models.ModelManager", Store)
    source = InstalledModels(n_ctx=256, parallel=1)
    assert [m.id for m in source.installed()] == ["known"]
    assert source.find("imported") is None
    assert source.find("k") == InstalledModel("known", frozenset({"known", "k"}))


def test_the_estimate_uses_the_models_own_context_unless_the_server_sets_one(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import localspec.service  # noqa: F401  imported before the patch: first imported under it (by
    # _estimate), it bound the fake store as its ModelManager for every later test in the process
    from localspec.server.residents import InstalledModels

    class Store:
        def installed_path(self, mid: str):
            return tmp_path / f"{mid}.gguf"

        def resolve(self, name: str):
            return SimpleNamespace(id=name, settings=SimpleNamespace(n_ctx=512))  # its [models.settings]

        def profile(self, name: str | None = None):
            return SimpleNamespace(n_ctx=4096)

    asked: list[int] = []

    def estimate_fit(path, *, n_ctx: int, ram: int, vram: int):
        asked.append(n_ctx)
        return SimpleNamespace(total_bytes=7)

    monkeypatch.setattr("localspec.models.ModelManager", Store)
    monkeypatch.setattr("localspec.models.fit.estimate_fit", estimate_fit)
    assert InstalledModels(n_ctx=None, parallel=2).need_bytes("m") == 7 and asked == [512 * 2]
    InstalledModels(n_ctx=256, parallel=2).need_bytes("m")  # --n-ctx wins over the model's own
    assert asked == [1024, 512]


def test_models_loaded_on_demand_drop_the_servers_lora_and_cache():
    loads = Loads()
    settings = ServerSettings(cache=True, router=False, lora_path="/adapters/style.gguf", lora_scale=0.5)
    app = create_app(settings, load=loads, models=FakeModels({B: GB}), memory=Memory(total=64 * GB))
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=30)
        _text(srv.base_url, B)
    assert loads.settings[PRIMARY].lora_path == "/adapters/style.gguf" and loads.settings[PRIMARY].cache
    on_demand = loads.settings[B]
    assert on_demand.lora_path is None and on_demand.lora_scale == 1.0 and on_demand.cache is False


def test_a_reply_holds_its_model_until_its_logprobs_are_read(jit):
    """The job is done before the reply reads the model for its logprob pieces: the model is still
    held then, so neither the reaper nor a load on demand closes it under the reply."""
    url, loads, state = jit.base_url, jit.loads, jit.state
    _text(url, B)
    rt = loads.last(B).target
    seen: list[bool] = []
    real = rt.piece

    def piece(token: int) -> bytes:
        if threading.current_thread().name == "test-uvicorn":  # the reply, on the event loop
            seen.append(state.extra[B].busy())
        return real(token)

    rt.piece = piece
    r = _ask(url, B, logprobs=1)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"]["tokens"]
    r = _ask(url, B, logprobs=1, stream=True)
    assert r.status_code == 200 and "[DONE]" in r.text
    assert seen and all(seen)
    assert wait_until(lambda: not state.extra[B].busy(), timeout=10)  # and released once written


def test_stop_waits_for_a_request_between_its_model_check_and_its_submission(jit):
    url, loads = jit.base_url, jit.loads
    _text(url, B)
    rt = loads.last(B).target
    entered, gate = threading.Event(), threading.Event()
    closed_then: list[bool] = []
    real = rt.tokenize

    def tokenize(text: str, *args, **kwargs) -> list[int]:
        if "hold me" in text:
            entered.set()
            gate.wait(30)
            closed_then.append(rt.closed)
        return real(text, *args, **kwargs)

    rt.tokenize = tokenize
    got: list = []
    stopped: list = []
    t = threading.Thread(target=lambda: got.append(_ask(url, B, prompt="hold me")))
    t.start()
    try:
        assert entered.wait(10)
        s = threading.Thread(target=lambda: stopped.append(
            request(url, "POST", "/v1/stop", json_body={"model": B})))
        s.start()
        # stop has taken the models away (detached) and waits on the hold; nothing is closed yet
        assert wait_until(lambda: jit.state.extra[B].loader.backend is None, timeout=10)
        assert not rt.closed and not stopped  # the close waits for the request holding the model
    finally:
        gate.set()
        t.join(30)
    s.join(30)
    assert closed_then and not any(closed_then)
    assert got[0].status_code == 503 and got[0].json()["error"]["code"] == "cancelled"
    assert stopped[0].status_code == 200 and stopped[0].json()["unloaded"] is True and rt.closed


def test_an_embedding_holds_the_profiles_models_until_its_vectors_are_made():
    from tests.fake_tier import ScriptedEmbedder

    class Gated(ScriptedEmbedder):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.gate, self.closed, self.closed_then = threading.Event(), threading.Event(), False, []

        def embed(self, text: str):
            self.entered.set()
            self.gate.wait(30)
            self.closed_then.append(self.closed)
            return super().embed(text)

        def close(self) -> None:
            self.closed = True

    emb = Gated()
    app = create_app(ServerSettings(cache=False, router=False), models=FakeModels({}), memory=Memory(total=64 * GB),
                     load=lambda s: scripted_backend(pipeline=scripted_pipeline(tiers=[scripted_tier(model_id=PRIMARY)]),
                                                     embedder=emb))
    with ServerThread(app) as srv:
        url, state = srv.base_url, app.state.server
        assert wait_until(lambda: request(url, "GET", "/health").status_code == 200, timeout=30)
        got: list = []
        stopped: list = []
        t = threading.Thread(target=lambda: got.append(request(
            url, "POST", "/v1/embeddings", json_body={"model": "scripted-embedder", "input": "hello"})))
        t.start()
        try:
            assert emb.entered.wait(10)
            assert state.primary.busy()  # the reaper leaves them loaded
            s = threading.Thread(target=lambda: stopped.append(
                request(url, "POST", "/v1/stop", json_body={"model": PRIMARY})))
            s.start()
            assert wait_until(lambda: state.primary.loader.backend is None, timeout=10)  # stop is waiting
            assert not emb.closed and not stopped  # stop closes them once the embedding is done
        finally:
            emb.gate.set()
            t.join(30)
        s.join(30)
        assert got[0].status_code == 200 and emb.closed_then == [False]
        assert stopped[0].json()["unloaded"] is True and emb.closed


def test_a_failed_first_load_is_tried_again_and_installed_models_stay_reachable():
    loads = Loads()
    failures: list[str] = []

    def load(settings: ServerSettings):
        if settings.target is None and not failures:
            failures.append("once")
            raise RuntimeError("the disk hiccupped")
        return loads(settings)

    app = create_app(ServerSettings(cache=False, router=False, retry_after_s=1), load=load,
                     models=FakeModels({B: GB}), memory=Memory(total=64 * GB))
    with ServerThread(app) as srv:
        url, state = srv.base_url, app.state.server
        assert wait_until(lambda: state.loader.state == "error", timeout=30)
        assert _text(url, B) == f"This is {B}."  # on demand, though the profile's names are unknown
        # Past Retry-After (polled, not slept): the next request naming the profile's model loads it again.
        assert wait_until(lambda: state.loader.may_retry(1), timeout=10)
        assert _text(url, PRIMARY) == f"This is {PRIMARY}."
        assert state.loader.state == "ok" and len(loads.engines[PRIMARY]) == 1


def test_another_spelling_of_the_profiles_target_is_a_404_without_a_reload(jit):
    url, loads = jit.base_url, jit.loads
    assert request(url, "POST", "/v1/stop", json_body={"model": PRIMARY}).json()["unloaded"] is True
    r = _ask(url, f"{PRIMARY}-alias")  # the store knows the spelling; the profile does not serve it
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert len(loads.engines[PRIMARY]) == 1 and jit.state.loader.backend is None


def test_a_busy_server_answers_429_before_looking_a_name_up_and_names_are_capped(jit):
    url, state, models = jit.base_url, jit.state, jit.models
    before = models.finds
    state.admission.held = state.admission.capacity
    try:
        r = _ask(url, "no-such-model")
        assert r.status_code == 429 and models.finds == before
    finally:
        state.admission.held = 0
    r = _ask(url, "m" * 600)
    assert r.status_code in (400, 422) and models.finds == before


def test_real_models_serve_the_small_one_and_load_the_other_on_demand(target_path, draft_path):
    """The real pair: `serve --model` the 0.5B, then a request naming the 1.5B loads it beside it."""
    from tests.common import DRAFT_ID, TARGET_ID, TEST_THREADS

    settings = ServerSettings(target=DRAFT_ID, mode="off", n_ctx=256, parallel=1, n_threads=TEST_THREADS,
                              cache=False, router=False, embeddings=False)
    with ServerThread(create_app(settings)) as srv:
        url = srv.base_url
        assert wait_until(lambda: request(url, "GET", "/health").status_code == 200, timeout=300)
        cards = _cards(url)
        assert cards[DRAFT_ID]["loaded"] is True and cards[DRAFT_ID]["on_demand"] is False
        assert cards[TARGET_ID]["loaded"] is False and cards[TARGET_ID]["on_demand"] is True
        r = _ask(url, TARGET_ID, max_tokens=2)
        assert r.status_code == 200 and r.json()["model"] == TARGET_ID, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        names = {m["name"]: m for m in request(url, "GET", "/v1/ps").json()["models"]}
        assert {DRAFT_ID, TARGET_ID} <= set(names) and names[TARGET_ID]["on_demand"] is True


def test_the_cache_routes_load_the_profiles_models_again_after_stop(jit):
    """CI's fuzz run: a stop it sent left GET /v1/cache/stats answering 503 "still loading" for good."""
    url, loads = jit.base_url, jit.loads
    assert request(url, "GET", "/v1/cache/stats").status_code == 200
    assert request(url, "POST", "/v1/stop", json_body={"model": PRIMARY}).json()["unloaded"] is True
    assert loads.last(PRIMARY).target.closed
    r = request(url, "GET", "/v1/cache/stats")
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "off" and not loads.last(PRIMARY).target.closed  # loaded again
    assert request(url, "POST", "/v1/stop", json_body={"model": PRIMARY}).json()["unloaded"] is True
    wrong = request(url, "POST", f"/v1/cache/{'0' * 32}/wrong", json_body={"token": "x"})
    assert wrong.status_code == 403, wrong.text  # answered by the models loaded again, not a 503
