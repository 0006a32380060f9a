"""The chat app without models: recorded event streams through Textual's pilot, the store, export."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rich.style import Style

from localspec.engine.events import Done, Stats, Token
from localspec.errors import ContextOverflowError, ModelNotFoundError
from localspec.tui.app import KEYS
from localspec.tui import ChatApp, ChatParams, ChatStore, ReplayBackend, SessionMetrics
from tests.tui_demo import DEMO_RSS, demo_backend, fixed_model_rows, load_recording
from localspec.tui.dialogs import ChatSettingsDialog, ConfirmDialog, ErrorDialog, HelpScreen
from localspec.tui.models_screen import ModelsScreen
from localspec.tui.store import export_chat, safe_filename
from tests.tui_support import wait_for
from localspec.tui.widgets import ORIGIN_STYLES, MessageView, PromptInput, code_blocks

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _reply(text_runs: list[tuple[str, str]], reason: str = "stop", error: str | None = None) -> list:
    events = [Token(t, (i,), o) for i, (t, o) in enumerate(text_runs)]
    drafted = sum(o == "draft" for _, o in text_runs)
    stats = Stats(mode="draft", prompt_tokens=20, ttft_ms=50.0, completion_tokens=len(text_runs),
                  decode_ms=100.0, target_passes=2, drafted=drafted + 1, accepted=drafted)
    return [*events, Done(reason, stats, "".join(t for t, _ in text_runs), error)]


def _colours(style) -> tuple:
    """Foreground and background as RGB: a Rich style string, or the Textual style it renders to."""
    if isinstance(style, str):
        rich = Style.parse(style)
        return tuple(tuple(c.get_truecolor()) if c else None for c in (rich.color, rich.bgcolor))
    return tuple(tuple(c.rgb) if c else None for c in (style.foreground, style.background))


def _app(tmp_path: Path, backend, **kw) -> ChatApp:
    factory = backend if callable(backend) and not isinstance(backend, ReplayBackend) else (lambda _p, **_: backend)
    return ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"), memory_probe=lambda: DEMO_RSS,
                   model_rows=fixed_model_rows, export_dir=tmp_path / "exports", **kw)


def _notified(app, text: str) -> bool:
    return any(text in str(n.message) for n in app._notifications)


async def _ready(app, pilot) -> None:
    await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")


def _assistant_views(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


# ---------------------------------------------------------------------- store and helpers


def test_store_persists_chats_messages_and_settings(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite")
    chat = store.create_chat("first", params=ChatParams(temperature=0.0, max_tokens=7, mode="lookup", draft_k=3))
    store.add_message(chat.id, "user", "hi")
    store.add_message(chat.id, "assistant", "hello", {"segments": [["hello", "draft"]]})
    store.update_settings(chat.id, "be brief", ChatParams(profile="qwen-7b", temperature=0.3))
    store.close()
    again = ChatStore(tmp_path / "c.sqlite")
    got = again.get_chat(chat.id)
    assert got.system_prompt == "be brief"
    assert got.params == ChatParams(profile="qwen-7b", temperature=0.3)
    assert [(m.role, m.content) for m in again.messages(chat.id)] == [("user", "hi"), ("assistant", "hello")]
    assert again.messages(chat.id)[1].meta["segments"] == [["hello", "draft"]]
    again.delete_chat(chat.id)
    assert again.list_chats() == []
    assert again.messages(chat.id) == []  # cascade


@pytest.mark.parametrize("title", ["../../etc/passwd", "/abs/path", "..", "a\\b:c*?", "", "  ..hidden"])
def test_export_names_cannot_leave_the_folder(tmp_path, title):
    name = safe_filename(title)
    assert "/" not in name and "\\" not in name and not name.startswith(".")
    store = ChatStore(tmp_path / "c.sqlite")
    chat = store.create_chat(title or "x")
    store.add_message(chat.id, "user", "q")
    out = tmp_path / "exports"
    path = export_chat(store.get_chat(chat.id), store.messages(chat.id), out)
    assert path.parent == out
    assert "## User" in path.read_text()


def test_code_blocks_finds_closed_and_cut_off_blocks():
    text = "a\n```python\nx = 1\n```\nb\n```\ny = 2"
    assert code_blocks(text) == ["x = 1", "y = 2"]
    assert code_blocks("no code") == []


# ---------------------------------------------------------------------- chat screen


async def test_reply_streams_and_is_saved(tmp_path):
    backend = demo_backend()
    prompt, events = load_recording()
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await pilot.click("#prompt")
        await pilot.press(*"hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: _assistant_views(app) and not app.generating, 10, "the reply")
        view = _assistant_views(app)[-1]
        assert view.content == events[-1].text
        assert "accepted" in str(view.query_one(".stats").render())
        assert app.query_one("#prompt", PromptInput).text == ""
        assert backend.requests.get_nowait().messages[-1].content == "hello"
        stored = app.store.messages(app.chat_id)
        assert [m.role for m in stored] == ["user", "assistant"]
        assert app.store.get_chat(app.chat_id).title == "hello"
        assert app.metrics.snapshot().requests == 1


async def test_newline_keys_do_not_send(tmp_path):
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await pilot.click("#prompt")
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one("#prompt", PromptInput).text == "a\nb"
        assert not app.store.messages(app.chat_id)


async def test_accepted_token_view_colours_by_engine_origin(tmp_path):
    _, events = load_recording()
    tokens = [e for e in events if isinstance(e, Token)]
    assert {t.origin for t in tokens} == {"draft", "target"}  # the recording has both
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("x")
        await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        await pilot.press("ctrl+t")
        view = _assistant_views(app)[-1]
        origins = view.query_one(".origins")
        assert origins.display and not view.query_one(".body").display
        text = origins.render()
        expected = "".join(t.text for t in tokens)
        assert text.plain == expected
        # The style of every character is the style of the origin of the token it came from.
        pos = 0
        for tok in tokens:
            for i in range(pos, pos + len(tok.text)):
                styles = [_colours(s.style) for s in text.spans if s.start <= i < s.end]
                assert styles == [_colours(ORIGIN_STYLES[tok.origin])], (i, tok)
            pos += len(tok.text)
        assert _colours(ORIGIN_STYLES["draft"]) != _colours(ORIGIN_STYLES["target"])
        await pilot.press("ctrl+t")
        assert view.query_one(".body").display and not origins.display


async def test_escape_cancels_and_regenerate_replaces(tmp_path):
    slow = ReplayBackend([_reply([("tok ", "target")] * 200)], delay=0.02)
    app = _app(tmp_path, slow)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("go")
        await wait_for(pilot, lambda: _assistant_views(app) and _assistant_views(app)[-1].content, 10, "a token")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, 10, "the cancel")
        stored = app.store.messages(app.chat_id)
        assert stored[-1].meta["finish_reason"] == "cancelled"
        assert 0 < stored[-1].meta["stats"]["completion_tokens"] < 200
        first_id = stored[-1].id
        slow.delay = 0.0
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.generating and app.store.messages(app.chat_id)[-1].id != first_id,
                       10, "the regenerated reply")
        stored = app.store.messages(app.chat_id)
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[-1].meta["finish_reason"] == "stop"
        assert len(_assistant_views(app)) == 1
        assert app.metrics.snapshot().requests == 2


async def test_edit_and_resend(tmp_path):
    backend = ReplayBackend([_reply([("one", "target")]), _reply([("two", "draft")])])
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("first question")
        await wait_for(pilot, lambda: not app.generating, 10)
        await pilot.press("ctrl+o")
        prompt = app.query_one("#prompt", PromptInput)
        await wait_for(pilot, lambda: prompt.text == "first question", 10, "the message back in the prompt")
        assert app.store.messages(app.chat_id) == []
        prompt.text = "second question"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.store.messages(app.chat_id)) == 2 and not app.generating, 10)
        assert [m.content for m in app.store.messages(app.chat_id)] == ["second question", "two"]
        assert len(list(app.query(MessageView))) == 2


async def test_copy_message_and_code_block(tmp_path):
    reply = [("Here:\n", "target"), ("```python\n", "draft"), ("print(1)\n", "draft"), ("```\n", "target")]
    app = _app(tmp_path, ReplayBackend([_reply(reply)]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("code please")
        await wait_for(pilot, lambda: not app.generating, 10)
        await pilot.press("f9")
        assert app.clipboard == "Here:\n```python\nprint(1)\n```\n"
        await pilot.press("f10")
        assert app.clipboard == "print(1)"


async def test_chats_new_rename_export_delete(tmp_path):
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        first = app.chat_id
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.chat_id != first, 5)
        second = app.chat_id
        await pilot.press("f2")
        await wait_for(pilot, lambda: app.screen.query("#value"), 5)
        app.screen.query_one("#value").value = "../../escape attempt"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.store.get_chat(second).title == "../../escape attempt", 5)
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], 5, "the dialog to close")
        assert len(app.query_one("#chat-list").children) == 2
        await pilot.press("f4")
        exported = list((tmp_path / "exports").iterdir())
        assert [p.name for p in exported] == ["escape attempt.md"]
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), 5)
        await pilot.click("#yes")
        await wait_for(pilot, lambda: app.chat_id == first, 5)
        assert [c.id for c in app.store.list_chats()] == [first]


async def test_settings_dialog_saves_and_rejects_bad_values(tmp_path):
    backend = demo_backend()
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsDialog), 5)
        dialog = app.screen
        dialog.query_one("#system").text = "Answer in French."
        dialog.query_one("#temperature").value = "-1"
        dialog.query_one("#save").press()
        await wait_for(pilot, lambda: "temperature" in str(dialog.query_one("#settings-error").render()), 10,
                       "the settings error")
        assert isinstance(app.screen, ChatSettingsDialog)
        dialog.query_one("#temperature").value = "0"
        dialog.query_one("#max_tokens").value = "33"
        dialog.query_one("#mode").value = "lookup"
        dialog.query_one("#draft_k").value = "4"
        dialog.query_one("#save").press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5)
        chat = app.store.get_chat(app.chat_id)
        assert chat.system_prompt == "Answer in French."
        assert chat.params == ChatParams(temperature=0.0, max_tokens=33, mode="lookup", draft_k=4)
        await app.send("bonjour")
        await wait_for(pilot, lambda: not app.generating, 10)
        request = backend.requests.get_nowait()
        assert request.messages[0].role == "system" and request.messages[0].content == "Answer in French."
        assert (request.max_tokens, request.mode, request.k, request.truncate) == (33, "lookup", 4, True)
        assert request.sampling.temperature == 0.0


async def test_metrics_pane_reads_session_metrics(tmp_path):
    app = _app(tmp_path, demo_backend(), metrics=SessionMetrics())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert not app.query_one("#metrics").display
        await pilot.press("ctrl+g")
        assert app.query_one("#metrics").display
        await app.send("x")
        await wait_for(pilot, lambda: not app.generating, 10)
        _, events = load_recording()
        stats = events[-1].stats
        body = str(app.query_one("#metrics-body").render())
        assert f"{stats.ttft_ms:.0f} ms" in body
        assert "requests    1" in body
        assert f"{DEMO_RSS / 1e6:,.0f} MB" in body
        assert app.query_one("#tps-spark").data == [pytest.approx(stats.tokens_per_second)]
        assert app.query_one("#acc-spark").data == [pytest.approx(stats.acceptance_rate)]


async def test_the_metrics_timer_survives_the_widgets_going_away(tmp_path):
    """The 2 s interval can fire while the app tears its widgets down on exit (seen in CI)."""
    app = _app(tmp_path, demo_backend(), metrics=SessionMetrics())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.query_one("#metrics").remove()
        app.chat_screen._tick()  # the interval is the chat screen's; no NoMatches: nothing to refresh does nothing


# ---------------------------------------------------------------------- errors


async def test_missing_models_offer_a_pull(tmp_path):
    def factory(_profile, **_):
        raise ModelNotFoundError("Model 'x' is not installed.", "Run `localspec models pull x`.")

    app = _app(tmp_path, factory)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog) and app.screen.query(".question"), 10,
                       "the pull offer")  # pushed and composed: the load fails while the app starts
        assert "not installed" in str(app.screen.query_one(".question").render())
        await pilot.click("#no")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmDialog), 10, "the offer dismissed")
        await app.send("hello")  # refused politely: nothing is loaded
        assert app.store.messages(app.chat_id) == []
        assert app.backend is None


async def test_context_overflow_shows_a_dialog_and_dropped_turns_a_notice(tmp_path):
    class TooLong(ReplayBackend):
        def start(self, request, route=None):
            raise ContextOverflowError(5000, 1024)

    app = _app(tmp_path, TooLong([_reply([("x", "target")])]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("a very long message")
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), 10)
        assert "5000 tokens" in str(app.screen.query_one(".question").render())
        assert not _assistant_views(app)
        assert not app.generating

    dropping = ReplayBackend([_reply([("ok", "target")])], dropped_messages=2)
    app = _app(tmp_path / "b", dropping)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("hi")
        await wait_for(pilot, lambda: not app.generating and _notified(app, "2 oldest message"), 10, "the notice")


async def test_generation_error_is_a_notification(tmp_path):
    app = _app(tmp_path, ReplayBackend([_reply([("part", "target")], reason="error", error="decode failed")]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("hi")
        # notify() posts a message: the notification lands in _notifications a beat after the reply ends.
        await wait_for(pilot, lambda: not app.generating and _notified(app, "decode failed"), 10, "the notification")
        assert app.store.messages(app.chat_id)[-1].meta["finish_reason"] == "error"
        assert app.metrics.snapshot().errors == 1


# ---------------------------------------------------------------------- screens


async def test_models_screen_help_and_palette(tmp_path):
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), 5)
        table = app.screen.query_one("#models-table")
        assert table.row_count == len(fixed_model_rows())
        await pilot.press("escape")
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5)
        keys = [row[0] for row in (app.screen.query_one("#keys").get_row_at(i)
                                    for i in range(app.screen.query_one("#keys").row_count))]
        assert {"escape", "ctrl+t", "ctrl+g", "ctrl+r", "ctrl+l"} <= set(keys)
        await pilot.press("escape")
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for _, _, _, description, _ in KEYS:
            assert description in titles


async def test_theme_choice_persists(tmp_path):
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        app.theme = "nord"
        await wait_for(pilot, lambda: app.store.get_pref("theme") == "nord", 10, "the theme saved")
    app2 = _app(tmp_path, demo_backend())
    async with app2.run_test(size=SIZE) as pilot:
        await _ready(app2, pilot)
        assert app2.theme == "nord"


def test_logs_go_to_a_file_not_the_terminal(tmp_path):
    from localspec.tui.logsetup import route_logs_to_file

    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.lastResort)
    try:
        logging.basicConfig(level=logging.WARNING)  # what the CLI sets up before the app starts
        path = route_logs_to_file(tmp_path / "tui.log")
        assert not [h for h in root.handlers if type(h) is logging.StreamHandler]
        logging.getLogger("localspec.llama_cpp").error("llama says hi")
        assert "llama says hi" in path.read_text()
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logging.lastResort = saved[2]


@pytest.mark.parametrize("blocker", ["file", "dir"])
def test_a_log_file_that_cannot_be_opened_is_one_line_before_the_app_starts(tmp_path, blocker):
    """A file where the logs folder goes (or a folder where the log goes) was a traceback at `localspec chat`."""
    from localspec.errors import LocalspecError
    from localspec.tui.logsetup import route_logs_to_file

    (tmp_path / "logs").write_text("x") if blocker == "file" else (tmp_path / "logs" / "tui.log").mkdir(parents=True)
    root = logging.getLogger()
    saved = list(root.handlers)
    with pytest.raises(LocalspecError) as err:
        route_logs_to_file(tmp_path / "logs" / "tui.log")
    assert root.handlers == saved  # the terminal's logging is left as it was
    assert "Cannot open the chat app's log file" in err.value.cause and "\n" not in str(err.value)


async def test_replies_go_to_the_shared_metrics_log(tmp_path):
    from localspec.metrics import Metrics, fetch_rows, open_reader

    db = tmp_path / "metrics.sqlite"
    metrics = SessionMetrics(Metrics(db))
    app = _app(tmp_path, demo_backend(), metrics=metrics)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("x")
        await wait_for(pilot, lambda: not app.generating, 10)
        assert metrics.sink.flush()
        conn = open_reader(db)
        rows = fetch_rows(conn)
        conn.close()
        _, events = load_recording()
        assert len(rows) == 1 and rows[0]["face"] == "tui"
        assert rows[0]["completion_tokens"] == events[-1].stats.completion_tokens
        assert rows[0]["target_model"] == "qwen2.5-coder-1.5b-instruct-q4_k_m"
        assert app.metrics.snapshot().requests == 1
