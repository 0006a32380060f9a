"""The chat app with the real default pair (1.5B target + 0.5B draft) through Textual's pilot.

One engine is loaded for the module (small n_ctx, 2 threads); each app gets its own
`LocalBackend` (its own step thread) over it, as `localspec chat` does with its own engine.
"""

from __future__ import annotations

import pytest

from localspec.engine.config import EngineConfig
from localspec.engine.events import Done, Token
from localspec.engine.scheduler import Engine
from localspec.tui import ChatApp, ChatParams, ChatStore, LocalBackend
from tests.tui_support import wait_for
from localspec.tui.widgets import ORIGIN_STYLES, MessageView
from tests.conftest import DRAFT_ID, TARGET_ID, TEST_THREADS

pytestmark = [pytest.mark.models, pytest.mark.anyio]
SIZE = (120, 36)
TIMEOUT = 240  # seconds per reply on a slow shared CI box; never a speed assertion
PARAMS = ChatParams(temperature=0.0, max_tokens=10, mode="draft")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def engine(target_path, draft_path):
    eng = Engine.load(str(target_path), str(draft_path),
                      EngineConfig(n_ctx=1024, n_threads=TEST_THREADS, mode="draft", draft_k=4))
    yield eng
    eng.close()


class Recorder(LocalBackend):
    """The real backend, keeping the events it delivered so the test knows each token's origin."""

    def __init__(self, engine) -> None:
        super().__init__(engine, profile="default", target=TARGET_ID, draft=DRAFT_ID, owns_engine=False)
        self.events: list = []

    def start(self, request, route=None):
        return _Recorded(super().start(request, route), self.events)


class _Recorded:
    def __init__(self, generation, sink: list) -> None:
        self._generation, self._sink = generation, sink
        self.dropped_messages, self.cached, self.route = generation.dropped_messages, None, None
        self.cache_entry = None  # the Generation protocol's: not from a cache

    def __iter__(self):
        for event in self._generation:
            self._sink.append(event)
            yield event

    def cancel(self) -> None:
        self._generation.cancel()


def _app(engine, tmp_path, backends: list | None = None) -> ChatApp:
    def factory(_profile, **_):
        backend = Recorder(engine)
        if backends is not None:
            backends.append(backend)
        return backend

    return ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"), new_chat_params=PARAMS,
                   export_dir=tmp_path / "exports")


def _assistants(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


def _finished_replies(app) -> list:
    """Stored assistant messages that have finished: durable, unlike the transient `generating`
    flag, which a fast machine can raise and lower between two polls."""
    return [m for m in app.store.messages(app.chat_id) if m.role == "assistant" and m.meta.get("finish_reason")]


async def _ask(app, pilot, text: str) -> MessageView:
    before = len(_finished_replies(app))
    await pilot.click("#prompt")
    await pilot.press(*text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(_finished_replies(app)) > before and not app.generating, TIMEOUT, "the reply")
    return _assistants(app)[-1]


async def test_prompt_streams_a_coloured_answer(engine, tmp_path):
    backends: list = []
    app = _app(engine, tmp_path, backends)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        view = await _ask(app, pilot, "Write hello world in Python.")
        events = backends[0].events
        tokens = [e for e in events if isinstance(e, Token)]
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason in ("stop", "length")
        assert len(tokens) >= 2 and view.content == done.text != ""
        assert view.meta["stats"]["completion_tokens"] == done.stats.completion_tokens
        assert "tok/s" in str(view.query_one(".stats").render())
        # Accepted-token view: each character carries the style of its token's origin.
        await pilot.press("ctrl+t")
        text = view.query_one(".origins").render()
        assert text.plain == "".join(t.text for t in tokens)
        pos = 0
        for tok in tokens:
            if tok.text:
                spans = [s for s in text.spans if s.start <= pos < s.end]
                bg = spans[0].style.background.rgb
                want = {"draft": ORIGIN_STYLES["draft"], "target": ORIGIN_STYLES["target"]}[tok.origin]
                assert "#%02x%02x%02x" % bg in want, (pos, tok)
            pos += len(tok.text)
        if done.stats.drafted:  # the pair drafts on this prompt; the colour shows it
            assert any(t.origin == "draft" for t in tokens)


async def test_escape_cancels_then_regenerate(engine, tmp_path):
    app = _app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        chat = app.store.get_chat(app.chat_id)
        app.store.update_settings(chat.id, "", ChatParams(temperature=0.0, max_tokens=400, mode="draft"))
        await pilot.click("#prompt")
        await pilot.press(*"Count from 1 to 200, one number per line.")
        await pilot.press("enter")
        await wait_for(pilot, lambda: _assistants(app) and _assistants(app)[-1].content, TIMEOUT, "a token")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, TIMEOUT, "the cancel")
        cancelled = app.store.messages(app.chat_id)[-1]
        assert cancelled.meta["finish_reason"] == "cancelled"
        assert cancelled.meta["stats"]["completion_tokens"] < 400
        app.store.update_settings(chat.id, "", PARAMS)
        await pilot.press("ctrl+r")
        await wait_for(
            pilot,
            lambda: any(m.id != cancelled.id for m in _finished_replies(app)) and not app.generating,
            TIMEOUT, "the regenerated reply",
        )
        stored = app.store.messages(app.chat_id)
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[-1].id != cancelled.id
        assert stored[-1].meta["finish_reason"] in ("stop", "length")
        assert app.metrics.snapshot().requests == 2


async def test_history_survives_switching_and_restart(engine, tmp_path):
    app = _app(engine, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        first = app.chat_id
        answer_a = (await _ask(app, pilot, "Say A.")).content
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.chat_id != first, 10)
        await _ask(app, pilot, "Say B.")
        # Switch back to the first chat in the sidebar.
        await pilot.click("#chat-list")
        chat_list = app.query_one("#chat-list")
        index = [item.id for item in chat_list.children].index(f"chat-{first}")
        chat_list.index = index
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.chat_id == first, 10, "the switch")
    again = _app(engine, tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(again.query(MessageView)) == 2, 30, "the history")
        assert again.chat_id == first
        assert [v.content for v in again.query(MessageView)] == ["Say A.", answer_a]
        assert len(again.query_one("#chat-list").children) == 2
        await wait_for(pilot, lambda: again.backend is not None, 60, "the backend")


async def test_connect_to_a_running_server(engine, tmp_path):
    """`localspec chat --connect`: the app streams from the real endpoint through the openai client."""
    from localspec.pipeline import LocalTier, Pipeline
    from localspec.server import Backend as ServerBackend
    from localspec.server import ServerSettings, create_app
    from localspec.tui import RemoteBackend
    from tests.server_harness import ServerThread

    def load(_settings):
        # The module fixture owns the engine: the tier only runs a worker over it.
        tier = LocalTier("large", engine, TARGET_ID, DRAFT_ID, TARGET_ID, owns_engine=False)
        return ServerBackend(pipeline=Pipeline({"large": tier}, "large"), target_id=TARGET_ID,
                             target_names={TARGET_ID, "auto"}, draft_id=DRAFT_ID, profile="default")

    settings = ServerSettings(n_ctx=1024, n_threads=TEST_THREADS, mode="draft")
    with ServerThread(create_app(settings, load=load)) as srv:
        backends: list = []

        def factory(_profile, **_):
            backend = RemoteBackend(srv.base_url)  # asks the server for its model, like --connect does
            backends.append(backend)
            return backend

        app = ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"), new_chat_params=PARAMS)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.backend is not None or app.screen is not app.default_screen,
                           120, "the connection")
            assert app.backend is not None, "connecting failed"
            assert app.backend.info.kind == "remote" and app.backend.info.target
            view = await _ask(app, pilot, "Say hello.")
            stored = app.store.messages(app.chat_id)[-1]
            assert stored.meta["finish_reason"] in ("stop", "length"), stored.meta
            assert view.content and stored.content == view.content
            assert stored.meta["stats"]["completion_tokens"] > 0
            assert app.metrics.snapshot().requests == 1


async def test_a_repeated_question_shows_the_cached_badge_and_f3_evicts_it(engine, tmp_path):
    """The in-process backend runs the shared pipeline: the second identical question is a cache hit."""
    from localspec.cache import SemanticCache

    cache = SemanticCache(directory=tmp_path / "cache")  # exact-match mode: no embedder needed here
    backends: list = []

    def factory(_profile, **_):
        backend = LocalBackend(engine, profile="default", target=TARGET_ID, draft=DRAFT_ID, owns_engine=False,
                               cache=cache, fingerprint=TARGET_ID)
        backends.append(backend)
        return backend

    app = ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"), new_chat_params=PARAMS)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        first = await _ask(app, pilot, "Say OK.")
        assert first.meta["cached"] is False and not first.query_one(".cached").display
        await pilot.press("ctrl+n")  # a new chat: same system prompt and no earlier turns, so same scope
        second = await _ask(app, pilot, "Say OK.")
        assert second.meta["cached"] is True and second.query_one(".cached").display
        assert second.content == first.content
        assert app.store.messages(app.chat_id)[-1].meta["cache_entry"]
        await pilot.press("f3")
        await wait_for(pilot, lambda: cache.stats()["false_hits"] == 1, 30, "the eviction")
        assert cache.stats()["entries"] == 0
        assert not app.store.messages(app.chat_id)[-1].meta["cache_entry"]


async def test_a_message_sent_while_the_models_load_gets_its_answer(tmp_path, monkeypatch):
    """`localspec chat`'s own loading path (LocalBackend.open: the profile's models, mode auto, a
    first-time calibration), held back until the message is typed; the answer comes once it is done."""
    import threading

    from localspec.engine.events import LoadStage
    from tests.conftest import DRAFT_ID

    monkeypatch.setenv("LOCALSPEC_CALIBRATION_DIR", str(tmp_path / "calibration"))  # calibrates afresh
    typed = threading.Event()
    seen: list = []

    def factory(profile, *, on_progress):
        def record(progress):
            seen.append(progress)
            on_progress(progress)

        if not typed.wait(120):
            raise RuntimeError("the test never typed its message")
        return LocalBackend.open(profile, mode="auto", n_ctx=1024, n_threads=TEST_THREADS, on_progress=record)

    app = ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"),
                  new_chat_params=ChatParams(temperature=0.0, max_tokens=10))
    notices: list[str] = []  # toasts expire; keep what was said
    shown = app.notify
    monkeypatch.setattr(app, "notify", lambda message, **kw: (notices.append(message), shown(message, **kw)))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.click("#prompt")
            await pilot.press(*"Say hello.")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.generating, 30, "the queued message")
            assert app.backend is None and [m.role for m in app.store.messages(app.chat_id)] == ["user"]
            typed.set()
            await wait_for(pilot, lambda: _finished_replies(app) and not app.generating, TIMEOUT, "the answer")
            answer = _finished_replies(app)[-1]
            assert answer.content and answer.meta["finish_reason"] in ("stop", "length")
            assert answer.meta["stats"]["mode"] == "auto"
            loaded = {p.model for p in seen if p.stage is LoadStage.LOAD_MODEL and p.finished}
            assert loaded == {TARGET_ID, DRAFT_ID}
            calibrated = [p for p in seen if p.stage is LoadStage.CALIBRATE and p.finished]
            assert len(calibrated) == 1 and calibrated[0].elapsed_s > 0
            fractions = [p.fraction for p in seen if p.stage is LoadStage.LOAD_MODEL and p.model == TARGET_ID]
            assert fractions == sorted(fractions) and len(fractions) > 2
            assert any(n.startswith(f"Calibrated speculative costs in {calibrated[0].elapsed_s:.1f} s") for n in notices)
    finally:
        typed.set()
