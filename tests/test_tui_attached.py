"""The chat app attached to a running `localspec serve` keeps every in-process feature (issue #29).

`localspec chat`'s own path (`chat_cmd.make_app`: find the server in serve.json, check its /health,
build the remote backend) against the real app and uvicorn on loopback over the scripted pair
(tests/fake_tier.py). Each test checks that the app loaded no model of its own, and one feature
through the attached path: token origins (Ctrl+T), the stats line, the metrics pane, F3.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import threading
from collections.abc import Iterator

import pytest
from rich.style import Style

from localspec import __version__
from localspec.attach.state import ServeState, write_state
from localspec.cache import SemanticCache
from localspec.cli import main
from localspec.engine.events import Done, Token
from localspec.server import ServerSettings
from localspec.tui import ChatParams, LocalBackend
from localspec.tui.store import reply_summary
from localspec.tui.widgets import ORIGIN_STYLES, MessageView
from tests.fake_tier import scripted, scripted_app, scripted_backend, scripted_engine, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request
from tests.tui_support import wait_for

pytestmark = pytest.mark.anyio
SIZE = (120, 36)
SCRIPT = scripted({"capital of France": "The capital of France is Paris, and Paris is lovely."},
                  default="I do not know.")
TARGET = "scripted-large"
QUESTION = "What is the capital of France?"
PARAMS = ChatParams(temperature=0.0, max_tokens=64)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def cache(tmp_path):
    return SemanticCache(directory=tmp_path / "server-cache")  # exact-match: no embedder


@pytest.fixture
def served(cache):
    """A server as `localspec serve` runs it (announced in serve.json): the scripted pair, drafting, cached."""
    with _attached_server(cache) as srv:
        yield srv


def _attached_server(cache: SemanticCache) -> ServerThread:
    tier = scripted_tier(model_id=TARGET, script=SCRIPT, draft_script=SCRIPT, mode="draft")
    settings = ServerSettings(router=False)
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier], cache=cache)),
                       settings=settings)
    srv = ServerThread(app, announce=settings)
    srv.metrics = app.state.metrics  # the server's handle on this machine's metrics log
    return srv


@pytest.fixture
def loads(monkeypatch):
    """Counts the in-process loads the chat app makes; each is the scripted pair the server has."""
    count: list[int] = []

    def open_here(cls, profile=None, **_kw):
        count.append(1)
        engine = scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode="draft")
        return cls(engine, profile=profile, target=TARGET, draft=f"{TARGET}-draft")

    monkeypatch.setattr(LocalBackend, "open", classmethod(open_here))
    return count


def _chat_app():
    """The app `localspec chat` builds (no --connect, no --local): it looks for a server itself."""
    from localspec.cli.chat_cmd import make_app

    args = argparse.Namespace(connect=None, api_key=None, local=False, model=None, profile=None, mode=None,
                              n_ctx=None, threads=None, cache_semantic=False, cache_judge="model")
    app = make_app(args)
    app.new_chat_params = PARAMS
    app.memory_probe = lambda: 1_000_000_000  # a fixed figure: the pane's memory row is not under test
    return app


async def _ask(app, pilot, text: str, timeout: float = 30) -> MessageView:
    before = len(_replies(app))
    await app.send(text)
    await wait_for(pilot, lambda: len(_replies(app)) > before and not app.generating
                   and _replies(app)[-1].finished, timeout, "the reply")
    return _replies(app)[-1]


def _replies(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


def _colours(style) -> tuple:
    """Foreground and background as RGB: a Rich style string, or the Textual style it renders to."""
    if isinstance(style, str):
        rich = Style.parse(style)
        return tuple(tuple(c.get_truecolor()) if c else None for c in (rich.color, rich.bgcolor))
    return tuple(tuple(c.rgb) if c else None for c in (style.foreground, style.background))


def _here() -> tuple[list[Token], Done]:
    """The same question to the same engine in this process: what the attached app must show."""
    from localspec.engine.config import GenerationRequest

    engine = scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode="draft")
    try:
        events = list(engine.generate(GenerationRequest(messages=[{"role": "user", "content": QUESTION}],
                                                        max_tokens=PARAMS.max_tokens)))
    finally:
        engine.close()
    done = events[-1]
    assert isinstance(done, Done)
    return [e for e in events if isinstance(e, Token) and e.text], done


async def test_attached_ctrl_t_colours_each_token_by_the_servers_origin(served, loads):
    tokens, _ = _here()
    assert {t.origin for t in tokens} == {"draft", "target"}  # both colours are under test
    app = _chat_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
        assert app.backend.info.kind == "remote" and app.backend.info.url == f"{served.base_url}/v1"
        view = await _ask(app, pilot, QUESTION)
        await pilot.press("ctrl+t")
        origins = view.query_one(".origins")
        assert origins.display and not view.query_one(".body").display
        text = origins.render()
        assert text.plain == "".join(t.text for t in tokens)
        pos = 0
        for tok in tokens:  # every character in the style of its token's origin, as the server sent it
            for i in range(pos, pos + len(tok.text)):
                styles = [_colours(s.style) for s in text.spans if s.start <= i < s.end]
                assert styles == [_colours(ORIGIN_STYLES[tok.origin])], (i, tok)
            pos += len(tok.text)
    assert not loads, "the chat app loaded a model although a server was running"


async def test_attached_stats_line_and_metrics_pane_show_the_servers_figures(served, loads):
    _, here = _here()
    app = _chat_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
        await pilot.press("ctrl+g")
        view = await _ask(app, pilot, QUESTION)
        stats = view.stats()
        assert stats is not None
        # The server's speculation figures, read from the final chunk's `localspec` object.
        assert stats.mode == "draft" and (stats.drafted, stats.accepted) == (here.stats.drafted, here.stats.accepted)
        assert stats.completion_tokens == here.stats.completion_tokens and stats.drafted > 0
        line = str(view.query_one(".stats").render())
        assert line == reply_summary(stats)
        assert f"accepted {here.stats.accepted}/{here.stats.drafted}" in line and "mode draft" in line
        assert f"{stats.completion_tokens} tokens" in line and "tok/s" in line
        await wait_for(pilot, lambda: "requests    1" in str(app.query_one("#metrics-body").render()), 10,
                       "the pane")
        body = str(app.query_one("#metrics-body").render())
        assert f"tokens      {stats.completion_tokens} out, {stats.prompt_tokens} in" in body
        assert f"{stats.ttft_ms:.0f} ms" in body
        assert f"target      {TARGET}" in body and "remote" in body and served.base_url in body
        # The pair's draft, context and processor, as the server's /v1/ps reports them.
        ps = {m["role"]: m for m in request(served.base_url, "GET", "/v1/ps").json()["models"]}
        assert f"draft       {ps['draft']['name']}" in body
        assert f"context     {stats.prompt_tokens + stats.completion_tokens} / {ps['target']['n_ctx']}" in body
        assert f"backend     remote · {ps['target']['processor']}" in body
        assert app.query_one("#acc-spark").data == [pytest.approx(stats.acceptance_rate)]
        assert app.query_one("#tps-spark").data == [pytest.approx(stats.tokens_per_second)]
    assert not loads


async def test_an_attached_reply_is_logged_once_by_the_server_not_again_by_the_app(served, loads):
    """The server records every request in this machine's metrics log (face "api"): the app, which
    reads the same log, keeps the reply for its pane only, so `localspec stats` counts it once."""
    from localspec.metrics import fetch_rows, open_reader

    app = _chat_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
        view = await _ask(app, pilot, QUESTION)
        assert app.metrics.snapshot().requests == 1
        assert app.metrics.sink.flush() and served.metrics.flush()
        assert app.metrics.sink.db_path == served.metrics.db_path  # one log, as on a user's machine
        conn = open_reader(served.metrics.db_path)
        try:
            rows = fetch_rows(conn)
        finally:
            conn.close()
    assert [r["face"] for r in rows] == ["api"]
    assert rows[0]["completion_tokens"] == view.stats().completion_tokens


async def test_attached_f3_evicts_the_cached_answer_on_the_server(served, loads, cache):
    app = _chat_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
        first = await _ask(app, pilot, QUESTION)
        assert first.meta["cached"] is False
        await pilot.press("ctrl+n")  # a new chat: the same scope, so the same question is a hit
        second = await _ask(app, pilot, QUESTION)
        assert second.meta["cached"] is True and second.query_one(".cached").display
        assert second.content == first.content and second.meta["cache_entry"]
        assert cache.stats()["entries"] == 1
        await pilot.press("f3")
        await wait_for(pilot, lambda: cache.stats()["false_hits"] == 1, 30, "the eviction")
        assert cache.stats()["entries"] == 0
        assert request(served.base_url, "GET", "/v1/cache/stats").json()["false_hits"] == 1
        assert not app.store.messages(app.chat_id)[-1].meta["cache_entry"]
        await wait_for(pilot, lambda: any("evicted" in str(n.message) for n in app._notifications), 10, "the toast")
    assert not loads


class _NotLocalspec(http.server.BaseHTTPRequestHandler):
    """Answers every GET and POST with JSON that is not localspec's /health."""

    asked: list[str]

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.asked.append(self.path)
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *_args) -> None:
        pass


@contextlib.contextmanager
def _foreign_server(port: int = 0, asked: list[str] | None = None) -> Iterator[int]:
    """Another program on a port (0: a free one; yielded): it answers every request, but not as
    localspec, and adds each path it is asked for to `asked`."""
    handler = type("Handler", (_NotLocalspec,), {"asked": asked if asked is not None else []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_a_port_that_is_not_localspec_is_not_attached_to_and_the_models_load_here(loads, caplog):
    """serve.json names a live process whose port answers, but not as localspec: nothing is sent to
    it; the app loads in-process and the log says why."""
    with _foreign_server() as port:
        write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=port, version=__version__))
        app = _chat_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
            assert app.backend.info.kind == "in-process" and len(loads) == 1
            view = await _ask(app, pilot, QUESTION)
            assert "Paris" in view.content
    assert any(f"127.0.0.1:{port}" in r.getMessage() and "not as localspec" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("then", ["nothing", "another program"])
async def test_a_prompt_is_sent_only_to_a_port_that_still_answers_as_localspec(cache, loads, then):
    """The server the app attached to stops; then nothing listens on its port, or another program
    does. The next message is not sent there: the app says why, loads the models here and answers."""
    app = _chat_app()
    asked: list[str] = []  # what the other program was asked for
    with contextlib.ExitStack() as serving:
        port = serving.enter_context(_attached_server(cache)).port
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
            assert app.backend.info.kind == "remote"
            first = await _ask(app, pilot, QUESTION)
            serving.close()  # the server stops; the app does not know yet
            if then == "another program":
                serving.enter_context(_foreign_server(port, asked))
            second = await _ask(app, pilot, "And Spain?")
            assert app.backend.info.kind == "in-process" and len(loads) == 1
            # The script answers the chat's first question, which the second prompt still holds.
            assert second is not first and second.content == first.content
            assert second.meta["finish_reason"] == "stop" and "Paris" in second.content
            assert [m.role for m in app.store.messages(app.chat_id)] == ["user", "assistant"] * 2
            said = "no longer answers" if then == "nothing" else "answers, but not as localspec any more"
            assert any(said in str(n.message) and f"127.0.0.1:{port}" in str(n.message) for n in app._notifications)
    assert set(asked) <= {"/health"}, asked  # the chat itself never reached that port
    assert asked or then == "nothing"


async def test_a_server_that_took_the_stopped_ones_place_is_attached_to(tmp_path, loads):
    """The attached server stops and another starts (serve.json names it): the next message goes to
    the new one, and no model loads here."""
    app = _chat_app()
    with contextlib.ExitStack() as serving:
        serving.enter_context(_attached_server(SemanticCache(directory=tmp_path / "a")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
            await _ask(app, pilot, QUESTION)
            serving.close()
            new = serving.enter_context(_attached_server(SemanticCache(directory=tmp_path / "b"))).base_url
            second = await _ask(app, pilot, "And Spain?")
            assert app.backend.info.url == f"{new}/v1" and "Paris" in second.content
            assert second.stats().mode == "draft"  # the new server's figures
    assert not loads


def test_served_pair_reads_only_what_parses():
    from localspec.attach.remote import ServedPair, served_pair

    pair = {"models": [
        {"name": "small-1", "role": "target", "tier": "small", "processor": "CPU", "n_ctx": 2048},
        {"name": "big-7", "role": "target", "tier": "large", "processor": "GPU (all layers)", "n_ctx": 8192},
        {"name": "big-draft", "role": "draft", "tier": "large", "processor": "GPU (all layers)", "n_ctx": 8192},
        {"name": "minilm", "role": "embedding", "processor": "CPU"},
    ]}
    assert served_pair(pair, "big-7") == ServedPair(draft="big-draft", n_ctx=8192, processor="GPU (all layers)")
    assert served_pair(pair, "small-1") == ServedPair(draft=None, n_ctx=2048, processor="CPU")
    assert served_pair({"models": []}, "big-7") is None  # idle: unloaded after its keep-alive
    for junk in (None, "ps", [], {"models": "x"}, {"models": [{"name": "a" * 600, "role": "target"}]},
                 {"models": [{"name": "t", "role": "target", "n_ctx": -1}]}):
        assert served_pair(junk, "t") is None, junk


# ---------------------------------------------------------------- generate


@pytest.fixture
def engine_loads(monkeypatch):
    """Counts the engines `generate` loads in this process; each is the scripted pair the server has."""
    from localspec import service

    count: list[int] = []

    def open_engine(**_kw):
        count.append(1)
        return scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode="draft")

    monkeypatch.setattr(service, "open_engine", open_engine)
    return count


# What differs between two runs of the same reply: speed, time, this process's memory, where it ran.
_VARYING = re.compile(r"[\d.]+ tok/s|TTFT \d+ ms|peak RSS \d+ MB|, attached to \S+")


@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "chat"])
def test_generate_attached_summarises_the_same_figures_as_in_process(served, engine_loads, capsys, chat):
    argv = ["generate", "--no-pull", *(["--chat"] if chat else []), QUESTION]
    assert main([*argv[:-1], "--local", argv[-1]]) == 0
    here = capsys.readouterr().err.strip().splitlines()[-1]
    assert main(argv) == 0
    attached = capsys.readouterr().err.strip().splitlines()[-1]
    assert len(engine_loads) == 1, "generate loaded a model although a server was running"
    assert f", attached to {served.base_url}" in attached and "attached" not in here
    assert "accepted" in here and "tokens/pass" in here  # the figures compared are there
    assert _VARYING.sub("", attached) == _VARYING.sub("", here)


@pytest.mark.parametrize("chat", [False, True], ids=["prompt", "chat"])
def test_generate_json_attached_has_the_same_stats_as_in_process(served, engine_loads, capsys, chat):
    argv = ["generate", "--no-pull", "--json", *(["--chat"] if chat else []), QUESTION]
    assert main([*argv[:-1], "--local", argv[-1]]) == 0
    here = json.loads(capsys.readouterr().out)["stats"]
    assert main(argv) == 0
    attached = json.loads(capsys.readouterr().out)["stats"]
    assert len(engine_loads) == 1
    same = ("mode", "completion_tokens", "prompt_tokens", "reused_prefix_tokens", "drafted", "accepted",
            "drafted_by_position", "accepted_by_position", "target_passes")
    assert {k: attached[k] for k in same} == {k: here[k] for k in same}
    assert here["drafted"] > 0


def test_generate_says_why_a_port_that_is_not_localspec_is_not_used(engine_loads, capsys):
    with _foreign_server() as port:
        write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=port, version=__version__))
        assert main(["generate", "--no-pull", QUESTION]) == 0
        out = capsys.readouterr()
    assert len(engine_loads) == 1 and "Paris" in out.out
    assert (f"localspec: http://127.0.0.1:{port} answers, but not as localspec (no localspec version in its "
            "/health), so nothing is sent there; loading the models here") in out.err.splitlines()


# ---------------------------------------------------------------- the real model


@pytest.mark.models
async def test_real_serve_attached_chat_shows_origins_stats_pane_and_f3(draft_path, loads, tmp_path):
    """The pilot test with a real model: `serve`'s app over the 0.5B model drafting for itself (so
    both origins occur), announced in serve.json; `localspec chat` attaches and loads nothing."""
    from localspec.engine.config import EngineConfig
    from localspec.engine.scheduler import Engine
    from localspec.pipeline import LocalTier, Pipeline
    from localspec.server import Backend as ServerBackend
    from localspec.server import create_app
    from tests.common import DRAFT_ID, TEST_THREADS

    engine = Engine.load(str(draft_path), str(draft_path),
                         EngineConfig(n_ctx=1024, n_threads=TEST_THREADS, mode="draft", draft_k=4))
    cache = SemanticCache(directory=tmp_path / "real-cache")
    settings = ServerSettings(n_ctx=1024, n_threads=TEST_THREADS, mode="draft", router=False)

    def load(_settings):
        tier = LocalTier("large", engine, DRAFT_ID, DRAFT_ID, DRAFT_ID, owns_engine=False)
        return ServerBackend(pipeline=Pipeline({"large": tier}, "large", cache), target_id=DRAFT_ID,
                             target_names={DRAFT_ID}, draft_id=DRAFT_ID, profile="default")

    try:
        with ServerThread(create_app(settings, load=load), announce=settings) as srv:
            app = _chat_app()
            app.new_chat_params = ChatParams(temperature=0.0, max_tokens=12)
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: app.backend is not None, 240, "the backend")
                assert app.backend.info.url == f"{srv.base_url}/v1" and app.backend.info.draft == DRAFT_ID
                await pilot.press("ctrl+g")
                view = await _ask(app, pilot, "Write a Python function that adds two numbers.", timeout=240)
                stats = view.stats()
                assert stats is not None and view.meta["finish_reason"] in ("stop", "length"), view.meta
                # Origins: each token's, from the stream, coloured by Ctrl+T.
                assert "".join(text for text, _ in view.segments) == view.content
                assert "draft" in {origin for _, origin in view.segments} and stats.drafted > 0
                await pilot.press("ctrl+t")
                text = view.query_one(".origins").render()
                assert text.plain == view.content
                pos = 0
                for chunk, origin in view.segments:
                    for i in (pos, pos + len(chunk) - 1):
                        styles = [_colours(s.style) for s in text.spans if s.start <= i < s.end]
                        assert styles == [_colours(ORIGIN_STYLES[origin])], (i, chunk, origin)
                    pos += len(chunk)
                # The stats line and the pane: the server's figures.
                assert str(view.query_one(".stats").render()).startswith(reply_summary(stats))  # then "· length"
                assert stats.mode == "draft" and f"accepted {stats.accepted}/{stats.drafted}" in reply_summary(stats)
                await wait_for(pilot, lambda: "requests    1" in str(app.query_one("#metrics-body").render()), 10)
                body = str(app.query_one("#metrics-body").render())
                assert f"tokens      {stats.completion_tokens} out, {stats.prompt_tokens} in" in body
                assert f"draft       {DRAFT_ID}" in body and "/ 1024" in body
                # F3: the same question in a new chat is the server's cache hit; F3 evicts it there.
                await pilot.press("ctrl+t", "ctrl+n")
                again = await _ask(app, pilot, "Write a Python function that adds two numbers.", timeout=240)
                assert again.meta["cached"] is True and again.content == view.content
                await pilot.press("f3")
                await wait_for(pilot, lambda: cache.stats()["false_hits"] == 1, 30, "the eviction")
                assert cache.stats()["entries"] == 0
    finally:
        engine.close()
    assert not loads, "the chat app loaded a model although a server was running"
