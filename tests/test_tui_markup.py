"""Untrusted text in the chat app is shown as it is, never parsed as markup.

Chat titles live in the database, error text quotes user input (pydantic puts `[type=...]` in
its messages), model ids come from registries and servers: `[/]` in any of them used to crash the
app with MarkupError, and `[@click=...]` became a live action link.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets._toast import Toast  # not exported by textual.widgets

from localspec.engine.events import Done, Stats, Token
from localspec.models import ModelRow
from localspec.tui import BackendInfo, ChatApp, ChatParams, ChatStore, ReplayBackend
from tests.tui_demo import DEMO_RSS, demo_backend, fixed_model_rows
from localspec.tui.dialogs import ErrorDialog
from localspec.tui.models_screen import ModelsScreen
from tests.tui_support import wait_for

SIZE = (120, 36)
pytestmark = pytest.mark.anyio

CLOSING_TAG = "why does a[/]b fail"
CLICK_ACTION = "[@click=app.quit]x"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _app(tmp_path: Path, backend, model_rows=fixed_model_rows) -> ChatApp:
    return ChatApp(lambda _p, **_: backend, store=ChatStore(tmp_path / "chats.sqlite"),
                   memory_probe=lambda: DEMO_RSS, model_rows=model_rows, export_dir=tmp_path / "exports")


def _stored_chat(tmp_path: Path, title: str, params: ChatParams | None = None) -> None:
    store = ChatStore(tmp_path / "chats.sqlite")
    store.create_chat(title, params=params)
    store.close()


def _shown(widget) -> str:
    """The text a widget shows: its visual's plain text."""
    visual = widget.visual if hasattr(widget, "visual") else widget.render()
    return getattr(visual, "plain", None) or str(visual)


async def _ready(app, pilot) -> None:
    await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")


async def test_a_stored_title_with_a_closing_tag_starts_the_app_and_shows_as_typed(tmp_path):
    _stored_chat(tmp_path, CLOSING_TAG)
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        label = app.query_one("#chat-list ListItem Label")
        assert _shown(label) == CLOSING_TAG
        assert app.title == f"localspec — {CLOSING_TAG}"


async def test_a_click_action_in_a_title_is_text_not_a_link(tmp_path):
    _stored_chat(tmp_path, CLICK_ACTION)
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        label = app.query_one("#chat-list ListItem Label")
        assert _shown(label) == CLICK_ACTION
        await pilot.click(label)
        await pilot.pause()
        assert app.is_running and app.return_code is None  # the click selected the chat; nothing quit


async def test_an_error_dialog_shows_brackets_as_written(tmp_path):
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        app.push_screen(ErrorDialog("Setting 'a[/]b' is invalid.", "Use [@click=app.quit]this[/] instead."))
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), 5, "the dialog")
        await pilot.pause()
        assert _shown(app.screen.query_one(".question")) == "Setting 'a[/]b' is invalid."
        assert _shown(app.screen.query_one(".fix")) == "Fix: Use [@click=app.quit]this[/] instead."


async def test_a_pydantic_error_about_chat_parameters_is_shown_in_a_dialog(tmp_path):
    """max_tokens 0 in the stored settings: pydantic's message carries `[type=greater_than, ...]`."""
    _stored_chat(tmp_path, "bad settings", ChatParams(max_tokens=0))
    app = _app(tmp_path, demo_backend())
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await app.send("hello")
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), 10, "the dialog")
        await pilot.pause()
        shown = _shown(app.screen.query_one(".question"))
        assert "Invalid chat parameters" in shown and "[type=greater_than" in shown
        assert not app.generating


async def test_toasts_and_the_status_line_show_model_text_as_written(tmp_path):
    text = "a[/]b"
    reply = [Token("part", (1,), "target"), Done("error", Stats(mode="off"), "part", f"decode {text} failed")]
    info = BackendInfo(kind="replay", target=f"[bold]{text}", accelerator="CPU", n_ctx=1024)
    app = _app(tmp_path, ReplayBackend([reply], info=info))
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts are off in tests by default
        await _ready(app, pilot)
        assert _shown(app.query_one("#status")).startswith(f"[bold]{text} · replay")
        await app.send("hi")
        await wait_for(pilot, lambda: not app.generating and app.screen.query(Toast), 10, "the error toast")
        await pilot.pause()
        toasts = [str(t.render()) for t in app.screen.query(Toast)]
        assert any(f"decode {text} failed" in t for t in toasts), toasts


async def test_the_models_screen_shows_model_ids_as_written(tmp_path):
    odd = ModelRow(id=f"evil{CLOSING_TAG}", role="target", family="x", quant="Q4[/]", aliases=(), installed=True,
                   size=1000, path=None, source=None, fit=None)
    app = _app(tmp_path, demo_backend(), model_rows=lambda: [odd])
    async with app.run_test(size=SIZE) as pilot:
        await _ready(app, pilot)
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), 5, "the models screen")
        await pilot.pause()
        row = app.screen.query_one("#models-table").get_row_at(0)
        assert [str(c) for c in row[:3]] == [odd.id, "target", "Q4[/]"]
