"""Hostile text in the chat app: model output, stored chats and error causes are untrusted, and the
terminal is the user's. Nothing they hold may act on the terminal (escape sequences, C1 controls),
reorder what the user reads (bidi overrides), or cost work out of proportion to what is shown.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events
from textual.widgets import Button, TextArea

from localspec.engine.events import Done, Stats, Token
from localspec.tui import ChatApp, ChatStore, ReplayBackend
from localspec.tui.dialogs import ChatSettingsDialog, ConfirmDialog
from localspec.tui.safe_text import terminal_safe
from localspec.tui.widgets import MessageView
from tests.tui_demo import DEMO_RSS, fixed_model_rows
from tests.tui_support import wait_for

SIZE = (120, 36)
pytestmark = pytest.mark.anyio

# What a model (or a stored chat) can hold that a terminal would act on: clear the screen, retitle
# the window, an OSC 8 link, an OSC 52 clipboard write (ST-terminated, as BEL is dropped anyway),
# the C1 forms of CSI and OSC, and a right-to-left override.
CLEAR, TITLE, LINK = "\x1b[2J", "\x1b]0;pwned\x1b\\", "\x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\"
CLIPBOARD, C1_CSI, C1_OSC, RLO = "\x1b]52;c;cHduZWQ=\x1b\\", "\x9b2J", "\x9d0;t\x9c", "\u202e"
HOSTILE = f"a{CLEAR}b{TITLE}c{LINK}d{CLIPBOARD}e{C1_CSI}f{C1_OSC}g{RLO}h"
ACTIVE = ("\x1b", "\x9b", "\x9d", "\x9c", RLO)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _app(tmp_path: Path, backend: ReplayBackend) -> ChatApp:
    return ChatApp(lambda _p, **_: backend, store=ChatStore(tmp_path / "chats.sqlite"), memory_probe=lambda: DEMO_RSS,
                   model_rows=fixed_model_rows, export_dir=tmp_path / "exports")


def _reply(text: str, reason: str = "stop", error: str | None = None) -> list:
    tokens = [Token(text[i:i + 7], (i,), "target") for i in range(0, len(text), 7)]
    return [*tokens, Done(reason, Stats(mode="off", completion_tokens=len(tokens)), text, error)]


def _drawn(app: ChatApp) -> str:
    """What the app writes to the terminal for a full repaint of the current screen, minus the
    escape sequences Textual itself writes (styles and cursor moves)."""
    import re

    update = app.screen._compositor.render_update(full=True)
    written = update.render_segments(app.console)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written)


def _active(drawn: str) -> list[str]:
    return [c for c in ACTIVE if c in drawn]


async def _ready(app, pilot) -> None:
    await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")


def test_terminal_safe_shows_controls_and_keeps_the_rest():
    assert terminal_safe("a\x1b[2Jb\x00\x7f") == "a\u241b[2Jb\u2400\u2421"
    assert terminal_safe("x\x9by\u202ez\ud800") == "x<U+009B>y<U+202E>z\ufffd"
    assert terminal_safe("line\r\nnext\ttab \u200d\U0001f600 עברית") == "line\nnext\ttab \u200d\U0001f600 עברית"


async def test_escape_sequences_in_a_reply_never_reach_the_terminal(tmp_path):
    app = _app(tmp_path, ReplayBackend([_reply(HOSTILE)]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send(f"say {HOSTILE}")
        await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        await pilot.pause()
        drawn = _drawn(app)
        assert _active(drawn) == []
        assert "\u241b]0;pwned" in drawn  # shown, as a stand-in
        await pilot.press("ctrl+t")  # the accepted-token view draws the same text
        await pilot.pause()
        assert _active(_drawn(app)) == []
        assert [m.content for m in app.store.messages(app.chat_id)] == [f"say {HOSTILE}", HOSTILE]  # kept as written


async def test_escape_sequences_in_a_stored_chat_and_an_error_never_reach_the_terminal(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat(f"t{TITLE}", system_prompt=f"sys{CLEAR}")
    store.add_message(chat.id, HOSTILE, "a role from a newer version")
    store.add_message(chat.id, "user", HOSTILE)
    store.close()
    app = _app(tmp_path, ReplayBackend([_reply("part", "error", f"decode {CLIPBOARD} failed")]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await _ready(app, pilot)
        await app.send("hi")
        await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        await pilot.pause()
        assert "\u241b]52" in _drawn(app)  # the error toast, with a stand-in
        assert _active(_drawn(app)) == []
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsDialog), 5, "the settings")
        await pilot.pause()
        assert _active(_drawn(app)) == []
        app.screen.query_one("#save", Button).press()  # unedited: the stored prompt stays as it was
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5, "the settings to close")
        assert app.store.get_chat(chat.id).system_prompt == f"sys{CLEAR}"
        await pilot.press("ctrl+o")  # edit and resend: the message goes back into the prompt box
        await pilot.pause()
        assert _active(_drawn(app)) == []


async def test_pasted_escapes_go_into_the_prompt_as_stand_ins(tmp_path):
    app = _app(tmp_path, ReplayBackend([_reply("ok")]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        prompt = app.query_one("#prompt", TextArea)
        prompt.post_message(events.Paste(HOSTILE))
        await pilot.pause()
        assert prompt.text == terminal_safe(HOSTILE)
        assert _active(_drawn(app)) == []


async def _click_link(app, pilot) -> None:
    """Click the first word of the reply's paragraph (the link's text)."""
    await app.send("links")
    await wait_for(pilot, lambda: not app.generating, 10, "the reply")
    await pilot.pause()
    view = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
    await pilot.click(view.query_one("MarkdownParagraph"), offset=(1, 0))
    await pilot.pause()


@pytest.mark.parametrize("href", ["ssh://evil.example/x", "smb://evil.example/share", "vscode://evil/x"])
async def test_a_link_in_a_reply_to_another_scheme_is_not_opened(tmp_path, monkeypatch, href):
    opened: list[str] = []
    monkeypatch.setattr(ChatApp, "open_url", lambda self, url, **_: opened.append(url))
    app = _app(tmp_path, ReplayBackend([_reply(f"[docs]({href}) for more")]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await _click_link(app, pilot)
        assert not isinstance(app.screen, ConfirmDialog)
        assert opened == []


async def test_a_web_link_in_a_reply_opens_after_the_user_saw_its_address(tmp_path, monkeypatch):
    href = "https://evil.example/phish"
    opened: list[str] = []
    monkeypatch.setattr(ChatApp, "open_url", lambda self, url, **_: opened.append(url))
    app = _app(tmp_path, ReplayBackend([_reply(f"[the official docs]({href}) for more")]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await _click_link(app, pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), 5, "the question")
        assert href in str(app.screen.query_one(".question").render())
        assert opened == []
        app.screen.query_one("#yes", Button).press()
        await wait_for(pilot, lambda: opened, 5, "the link to open")
        assert opened == [href]


def _table(rows: int, cols: int) -> str:
    line = "|" + "|".join(f"c{i}" for i in range(cols)) + "|\n"
    return line + "|" + "---|" * cols + "\n" + line * rows


def _widgets(view: MessageView) -> int:
    return len(view.query("*"))


@pytest.mark.parametrize("text", [_table(100, 20), "para\n\n" * 2000, "- item\n" * 2000],
                         ids=["table-100x20", "2000-paragraphs", "2000-list-items"])
async def test_a_reply_with_thousands_of_markdown_blocks_is_drawn_as_plain_text(tmp_path, text):
    """Each block is a widget in Textual's Markdown: 2,000 cells cost 2,000 widgets to lay out on every frame."""
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("stored")
    store.add_message(chat.id, "assistant", text, {"stats": {}})
    store.close()
    app = _app(tmp_path, ReplayBackend([_reply(text)]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        stored = app.query(MessageView).last()
        assert _widgets(stored) < 20 and stored.query(".plain-note")
        await app.send("again")
        await wait_for(pilot, lambda: not app.generating, 30, "the reply")
        await pilot.pause()
        streamed = app.query(MessageView).last()
        assert _widgets(streamed) < 20 and streamed.query(".plain-note")
        assert str(streamed.query_one(".body").render()) == text  # all of it, as written


async def test_a_reply_with_a_small_table_stays_markdown(tmp_path):
    app = _app(tmp_path, ReplayBackend([_reply(_table(5, 3))]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("table")
        await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        await pilot.pause()
        view = app.query(MessageView).last()
        assert view.query("MarkdownTable") and not view.query(".plain-note")


async def test_a_long_chat_opens_with_its_last_page_and_shows_earlier_ones_on_request(tmp_path):
    """500 stored messages were 7,500 widgets: most of a minute to open, seconds a frame to stream into."""
    from localspec.tui.chats import PAGE

    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("long")
    for i in range(100):
        store.add_message(chat.id, "user" if i % 2 == 0 else "assistant", f"message {i}", {} if i % 2 == 0 else {"stats": {}})
    store.close()
    app = _app(tmp_path, ReplayBackend([_reply("the answer")]))
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        assert [v.content for v in app.query(MessageView)] == [f"message {i}" for i in range(100 - PAGE, 100)]
        def shown() -> list[str]:
            return [v.content for v in app.query(MessageView)]

        # The earlier page mounts in the background: wait for it (one pause was not always enough on a loaded
        # box, beside the fast suite's other worker and another process); the deadlines are about hangs.
        app.query_one("#earlier", Button).press()  # at the top: scrolled out of view
        await wait_for(pilot, lambda: len(shown()) == 2 * PAGE, 60, "the second page")
        assert shown()[:2] == [f"message {100 - 2 * PAGE}", f"message {100 - 2 * PAGE + 1}"]
        app.query_one("#earlier", Button).press()  # at the top: scrolled out of view
        await wait_for(pilot, lambda: len(shown()) == 100, 60, "every page")
        assert shown() == [f"message {i}" for i in range(100)]
        assert not app.query("#earlier")
        await app.send("and now?")  # a reply still goes to the end
        await wait_for(pilot, lambda: not app.generating, 60, "the reply")
        assert [v.content for v in app.query(MessageView)][-2:] == ["and now?", "the answer"]


def test_the_markdown_export_holds_no_escapes_and_no_open_code_block(tmp_path):
    from localspec.tui.store import export_chat

    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat(f"t{TITLE}\n# forged")
    store.add_message(chat.id, "user", "write code")
    store.add_message(chat.id, "assistant", f"```python\nprint(1){CLEAR}", {"stats": {}})  # cut off by max_tokens
    store.add_message(chat.id, "user", "thanks")
    text = export_chat(store.get_chat(chat.id), store.messages(chat.id), tmp_path / "out").read_text(encoding="utf-8")
    assert _active(text) == []
    assert text.splitlines()[0] == "# t\u241b]0;pwned\u241b\\ # forged"
    assert "print(1)\u241b[2J\n```\n\n## User\n\nthanks" in text  # the block ends before the next turn
