"""A bad value in chats.sqlite (a hand edit, another tool, a newer version) never stops the chat app:
the row shows what it can, the app says once what it repaired and how to fix it, and the row itself
is left as it was.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from textual.widgets import Button, Select

from localspec.engine.events import Done, Stats, Token
from localspec.tui import ChatApp, ChatParams, ChatStore, ReplayBackend
from localspec.tui.dialogs import ChatSettingsDialog
from localspec.tui.widgets import MessageView
from tests.models_helpers import write_overlay
from tests.tui_demo import DEMO_RSS, demo_backend, fixed_model_rows
from tests.tui_support import wait_for

SIZE = (120, 36)
pytestmark = pytest.mark.anyio
NOT_UTF8 = "CAST(X'C328FF41' AS TEXT)"  # a TEXT value whose bytes are not UTF-8


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _db(tmp_path: Path) -> Path:
    return tmp_path / "chats.sqlite"


def _write(tmp_path: Path, *statements: tuple[str, tuple]) -> None:
    """Rows as another writer leaves them: plain SQL into a file with the app's schema."""
    ChatStore(_db(tmp_path)).close()
    with sqlite3.connect(_db(tmp_path)) as db:
        for sql, args in statements:
            db.execute(sql, args)
    db.close()


def _chat_row(title: object = "t", params: object = "{}", title_sql: str = "?") -> tuple[str, tuple]:
    return (f"INSERT INTO chats (title, system_prompt, params, created, updated) VALUES ({title_sql}, '', ?, 1, 1)",
            ((title,) if title_sql == "?" else ()) + (params,))


def _message_row(role: str = "user", content: object = "hi", content_sql: str = "?") -> tuple[str, tuple]:
    return (f"INSERT INTO messages (chat_id, role, content, meta, created) VALUES (1, ?, {content_sql}, '{{}}', 1)",
            (role,) + ((content,) if content_sql == "?" else ()))


def _stored(tmp_path: Path, sql: str) -> object:
    with sqlite3.connect(_db(tmp_path)) as db:
        value = db.execute(sql).fetchone()[0]
    db.close()
    return value


def _app(tmp_path: Path, backend: ReplayBackend | None = None) -> ChatApp:
    return ChatApp(lambda _p, **_: backend or demo_backend(), store=ChatStore(_db(tmp_path)),
                   memory_probe=lambda: DEMO_RSS, model_rows=fixed_model_rows, export_dir=tmp_path / "exports")


def _notices(app: ChatApp, text: str) -> list[str]:
    return [str(n.message) for n in app._notifications if text in str(n.message)]


async def _ready(app, pilot) -> None:
    await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")


def _replaying(texts: list[str]) -> ReplayBackend:
    """A backend whose one reply is these tokens."""
    tokens = [Token(t, (i,), "target") for i, t in enumerate(texts)]
    return ReplayBackend([[*tokens, Done("stop", Stats(mode="off"), "".join(texts))]])


async def _replied(app, pilot) -> None:
    """Send "hi" once the models are ready, and wait for the whole reply."""
    await _ready(app, pilot)
    await app.send("hi")
    await wait_for(pilot, lambda: not app.generating, 10, "the reply")


@pytest.mark.parametrize("params", ["not json", "null", "[1,2]"])
async def test_chat_settings_that_are_not_a_json_object_open_with_the_defaults_and_say_so(tmp_path, params):
    _write(tmp_path, _chat_row(params=params))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert app.store.get_chat(1).params == ChatParams()
        [notice] = _notices(app, "Chat 1's settings could not be read")
        assert "Fix: set them again in the chat settings (Ctrl+S)" in notice
    assert _stored(tmp_path, "SELECT params FROM chats") == params  # kept until the user saves new ones


async def test_a_last_open_chat_that_is_not_an_id_opens_the_newest_chat(tmp_path):
    _write(tmp_path, _chat_row(), ("INSERT INTO prefs VALUES ('last_chat', 'abc')", ()))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert app.chat_id == 1
        assert _notices(app, "is not a chat id ('abc')")
    assert _stored(tmp_path, "SELECT value FROM prefs WHERE key = 'last_chat'") == "1"


async def test_text_that_is_not_utf8_shows_with_replacement_characters_and_is_kept(tmp_path):
    _write(tmp_path, _chat_row(title_sql=NOT_UTF8), _message_row(content_sql=NOT_UTF8))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert app.title == "localspec — \ufffd(\ufffdA"
        [view] = app.query(MessageView)
        assert view.content == "\ufffd(\ufffdA"
        assert _notices(app, "Chat 1's title is not valid UTF-8") and _notices(app, "A message in chat 1 is not valid")
    assert _stored(tmp_path, "SELECT hex(CAST(title AS BLOB)) FROM chats") == "C328FF41"


async def test_a_binary_title_shows_as_text(tmp_path):
    _write(tmp_path, _chat_row(title=b"\xff\xfe bin"))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert app.title == "localspec — \ufffd\ufffd bin"
        assert _notices(app, "Chat 1's title is binary data, not text")


async def test_a_message_role_this_version_does_not_know_shows_as_written(tmp_path):
    _write(tmp_path, _chat_row(), _message_row(role="[/]weird role", content="hello"))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        [view] = app.query(MessageView)
        assert view.role == "[/]weird role" and view.has_class("other-role")
        assert str(view.query_one(".role").render()) == "[/]weird role"
        assert _notices(app, "the role '[/]weird role', which this version does not know")


def _foreign(tmp_path: Path, *statements: str) -> bytes:
    """A file in another program's (or version's) schema, written before the app first opens it."""
    with sqlite3.connect(_db(tmp_path)) as db:
        for sql in statements:
            db.execute(sql)
    db.close()
    return _db(tmp_path).read_bytes()


@pytest.mark.parametrize("statements", [
    ("CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT, created REAL, updated REAL)",
     "INSERT INTO chats VALUES (1, 'old', 1, 1)"),  # no system prompt nor settings: the app stopped (IndexError)
    ("CREATE TABLE t (x)", "CREATE VIEW chats AS SELECT 1 AS id"),  # stopped the app (no such column)
    ("CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INT, text TEXT)",),  # failed at the first send
])
async def test_a_database_in_another_schema_is_kept_aside_and_the_app_says_where(tmp_path, statements):
    before = _foreign(tmp_path, *statements)
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _replied(app, pilot)
        [notice] = _notices(app, "moved it to chats.sqlite.corrupt-")
        assert "is not a localspec chat database" in notice and "Fix:" in notice and "\n" not in notice
        assert [m.role for m in app.store.messages(app.chat_id)] == ["user", "assistant"]
    [aside] = tmp_path.glob("chats.sqlite.corrupt-*")
    assert aside.read_bytes() == before


async def test_an_unreadable_database_is_kept_aside_and_the_app_says_where(tmp_path):
    """It was moved aside with a line in the log file only: the app opened with every chat gone, unexplained."""
    _db(tmp_path).write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        [notice] = _notices(app, "moved it to chats.sqlite.corrupt-")
        assert "could not be read" in notice and "Fix:" in notice
    [aside] = tmp_path.glob("chats.sqlite.corrupt-*")
    assert aside.read_bytes() == b"SQLite format 3\x00" + b"\xff" * 4000


# ---------------------------------------------------------------------- what the app writes


async def test_a_reply_with_a_lone_surrogate_is_saved_with_a_replacement_character(tmp_path):
    """Half of a surrogate pair has no UTF-8 form: saving the streaming reply stopped the app. A pair
    that two tokens split is whole again once both have arrived."""
    app = _app(tmp_path, _replaying(["a", "\ud83d", "\ude00", "\ud800", "b"]))
    async with app.run_test(size=SIZE) as pilot:
        await _replied(app, pilot)
        assert app.is_running
    store = ChatStore(_db(tmp_path))
    assert [m.content for m in store.messages(1)] == ["hi", "a\U0001f600\ufffdb"]
    store.close()


# ---------------------------------------------------------------------- the chat settings dialog (Ctrl+S)


async def _settings(app, pilot) -> ChatSettingsDialog:
    await _ready(app, pilot)
    await pilot.press("ctrl+s")
    await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsDialog), 5, "the settings dialog")
    return app.screen


def _selected(dialog: ChatSettingsDialog, select_id: str) -> object:
    return dialog.query_one(f"#{select_id}", Select).value


async def test_a_stored_profile_models_toml_no_longer_has_shows_none_and_is_kept_until_saved(tmp_path):
    _write(tmp_path, _chat_row(params='{"profile": "gone-profile", "temperature": 0.2}'))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await _settings(app, pilot)
        assert _selected(dialog, "profile") is Select.NULL
        assert "Not available any more: profile 'gone-profile'" in str(dialog.query_one("#settings-notice").render())
        dialog.query_one("#cancel", Button).press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5)
        assert app.store.get_chat(1).params.profile == "gone-profile"  # Cancel keeps it
        dialog = await _settings(app, pilot)
        dialog.query_one("#save", Button).press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5)
        assert app.store.get_chat(1).params == ChatParams(temperature=0.2)  # the active profile, as shown


async def test_every_engine_mode_is_offered_auto_included(tmp_path):
    _write(tmp_path, _chat_row(params='{"mode": "auto"}'))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await _settings(app, pilot)
        assert _selected(dialog, "mode") == "auto" and not dialog.query("#settings-notice")
        dialog.query_one("#save", Button).press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5)
        assert app.store.get_chat(1).params.mode == "auto"


async def test_a_mode_and_route_this_version_does_not_offer_show_none_and_say_so(tmp_path):
    _write(tmp_path, _chat_row(params='{"mode": "turbo", "route": "medium"}'))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await _settings(app, pilot)
        assert _selected(dialog, "mode") is Select.NULL and _selected(dialog, "route") is Select.NULL
        notice = str(dialog.query_one("#settings-notice").render())
        assert "model 'medium'" in notice and "speculative mode 'turbo'" in notice


async def test_the_dialog_opens_when_models_toml_cannot_be_read(tmp_path):
    write_overlay("[profiles.mine\n")  # not TOML: no profile list at all
    _write(tmp_path, _chat_row(params='{"profile": "mine"}'))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dialog = await _settings(app, pilot)
        assert _selected(dialog, "profile") is Select.NULL
        assert "profile 'mine'" in str(dialog.query_one("#settings-notice").render())
        assert _notices(app, "The profile list could not be read")


async def test_copying_a_reply_with_a_lone_surrogate_copies_a_replacement_character(tmp_path):
    app = _app(tmp_path, _replaying(["a", "\ud800", "\n```\nx\ud800\n```\n"]))
    async with app.run_test(size=SIZE) as pilot:
        await _replied(app, pilot)
        await pilot.press("f9")
        assert app.clipboard == "a\ufffd\n```\nx\ufffd\n```\n"
        await pilot.press("f10")
        assert app.clipboard == "x\ufffd"


async def test_a_chat_whose_profile_is_gone_is_answered_by_the_loaded_models_and_says_so(tmp_path):
    """Loading the stored profile unloaded the models that could answer and then failed; with a factory
    that loads any name (the demo's), every send reloaded and the reply never came."""
    _write(tmp_path, _chat_row(params='{"profile": "gone-from-models-toml"}'))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        loaded = app.backend
        await app.send("hi")
        await wait_for(pilot, lambda: not app.screen.replies.generating, 20, "the reply")
        assert app.backend is loaded
        assert _notices(app, "This chat's profile 'gone-from-models-toml' is not in models.toml any more")
        assert [m.role for m in app.store.messages(1)] == ["user", "assistant"] and app.store.messages(1)[1].content


async def test_a_chat_holding_a_role_this_version_does_not_know_can_be_continued(tmp_path):
    """Every send showed "Invalid chat parameters": the engine takes system, user, assistant and tool only."""
    _write(tmp_path, _chat_row(), _message_row(role="critic", content="be brief"))
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("hi")
        await wait_for(pilot, lambda: not app.screen.replies.generating, 20, "the reply")
        assert [m.role for m in app.store.messages(1)] == ["critic", "user", "assistant"]
        assert app.store.messages(1)[2].content


async def test_the_models_screen_opens_when_models_toml_cannot_be_read(tmp_path):
    """Ctrl+L (and `a` there) read models.toml unguarded: a broken overlay stopped the whole app."""
    from localspec.tui.models_screen import ModelsScreen

    app = ChatApp(lambda _p, **_: demo_backend(), store=ChatStore(_db(tmp_path)), memory_probe=lambda: DEMO_RSS,
                  export_dir=tmp_path / "exports")  # no fixed rows: the models screen reads the store
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        write_overlay("[[models]\n")  # broken while the app runs (a hand edit)
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), 10, "the models screen")
        assert app.screen.rows == []
        [notice] = _notices(app, "invalid TOML")
        assert "Fix the syntax in" in notice and "models.toml" in notice
        await pilot.press("a")
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, ModelsScreen)
        assert len(_notices(app, "invalid TOML")) == 2
        await pilot.press("P")  # pull the active profile: none chosen, so the registry's default
        await wait_for(pilot, lambda: len(_notices(app, "invalid TOML")) == 3, 10, "the pull's refusal")
        assert app.is_running and not app.screen.busy


async def test_a_database_another_program_locks_while_the_app_runs_is_a_notice_and_the_message_stays(
        tmp_path, monkeypatch):
    """An sqlite3 shell (or a backup) holding chats.sqlite's lock past the busy timeout: sending stopped
    the app with "database is locked"."""
    from localspec.tui import store as store_module
    from localspec.tui.widgets import PromptInput

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.05)
    app = _app(tmp_path, _replaying(["hello"]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        holder = sqlite3.connect(_db(tmp_path), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            await pilot.click("#prompt")
            await pilot.press("h", "i", "enter")
            await wait_for(pilot, lambda: _notices(app, "is locked by another program"), 10, "the notice")
            assert app.is_running and app.query_one("#prompt", PromptInput).text == "hi"  # nothing lost
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        await pilot.press("enter")  # the lock gone: the same message goes
        await wait_for(pilot, lambda: len(app.store.messages(app.chat_id)) == 2 and not app.generating, 10)
        assert [m.content for m in app.store.messages(app.chat_id)] == ["hi", "hello"]


def test_a_streaming_reply_saves_again_after_another_program_let_the_file_go(tmp_path, monkeypatch):
    """The partial save runs on the UI thread's frame timer: a lock held past the busy timeout stopped the app."""
    from localspec.tui import store as store_module
    from localspec.tui.store import PartialReply

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.05)
    store = ChatStore(_db(tmp_path))
    chat = store.create_chat()
    row = store.add_message(chat.id, "assistant", "")
    partial = PartialReply(store, row.id, every_s=0)
    holder = sqlite3.connect(_db(tmp_path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        partial.grew("hel", [])  # not saved, and no exception
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    partial.grew("hello", [])
    assert store.messages(chat.id)[0].content == "hello"
    store.close()


@pytest.mark.parametrize("action", ["new", "rename", "open", "delete", "settings", "f2", "ctrl+s", "theme"])
async def test_chat_list_actions_while_another_program_locks_the_file_are_a_notice(tmp_path, monkeypatch, action):
    """New chat, rename, switching chats, delete and saving the chat settings stopped the app too."""
    from localspec.tui import store as store_module
    from localspec.tui.dialogs import ConfirmDialog

    _write(tmp_path, _chat_row(title="first"), _chat_row(title="second"))
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.05)
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        chats = app.chat_screen.chats
        other = 1 if app.chat_id == 2 else 2
        if action == "delete":  # the dialogs open before the lock is taken; confirming writes
            chats.ask_delete()
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), 5)
        elif action == "settings":
            dialog = await _settings(app, pilot)
        holder = sqlite3.connect(_db(tmp_path), isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            if action == "new":
                await chats.new()
            elif action == "rename":
                await chats.rename(app.chat_id, "renamed")
            elif action == "open":
                await chats.open(other)
            elif action == "delete":
                app.screen.dismiss(True)
            elif action == "settings":
                dialog.query_one("#save", Button).press()
            elif action == "theme":
                app.theme = next(t for t in app.available_themes if t != app.theme)
            else:  # opening a dialog reads the chat
                await pilot.press(action)
            await wait_for(pilot, lambda: _notices(app, "is locked by another program"), 10, "the notice")
            assert app.is_running
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert sorted(c.title for c in app.store.list_chats()) == ["first", "second"]  # nothing half-done
