"""The chat app's first minute: a message sent while the models load is queued and answered, the
load shows its progress, and a reply cut off by the app's end is kept, marked interrupted.

The backends here are for control flow only (a load that waits for the test, a slow recorded
reply); tests/test_tui_real.py does the queued send with the real models.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localspec.engine.events import LoadProgress, LoadStage
from localspec.errors import LocalspecError
from localspec.tui import ChatApp, ChatStore, ReplayBackend
from tests.tui_demo import DEMO_RSS, demo_backend, fixed_model_rows, load_recording
from localspec.tui.dialogs import ErrorDialog
from localspec.tui.store import PartialReply
from tests.tui_support import wait_for
from localspec.tui.widgets import MessageView, PromptInput
from tests.tui_kill_child import slow_reply

SIZE = (120, 36)
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class GatedLoad:
    """A backend factory whose load reports `progress`, then waits until the test releases it."""

    def __init__(self, backend, progress: tuple[LoadProgress, ...] = (), error: LocalspecError | None = None) -> None:
        self.backend, self.progress, self.error = backend, progress, error
        self.release = threading.Event()

    def __call__(self, _profile, *, on_progress=None):
        for p in self.progress if on_progress else ():
            on_progress(p)
        if not self.release.wait(60):
            raise LocalspecError("The test never released the load.", "Release it.")
        if self.error is not None:
            raise self.error
        return self.backend


def _app(tmp_path: Path, factory) -> ChatApp:
    return ChatApp(factory, store=ChatStore(tmp_path / "chats.sqlite"), memory_probe=lambda: DEMO_RSS,
                   model_rows=fixed_model_rows, export_dir=tmp_path / "exports")


def _shown(widget) -> str:
    return str(widget.render())


def _assistants(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def _type_and_send(pilot, text: str) -> None:
    await pilot.click("#prompt")
    await pilot.press(*text)
    await pilot.press("enter")


# ---------------------------------------------------------------------- queued while loading


async def test_a_message_sent_while_the_models_load_is_answered_once_they_are(tmp_path):
    backend = demo_backend()
    _, events = load_recording()
    load = GatedLoad(backend, progress=(LoadProgress(LoadStage.LOAD_MODEL, "qwen-test", 0.45, 1.25),))
    app = _app(tmp_path, load)
    try:
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one("#status")
            await wait_for(pilot, lambda: "qwen-test 45% · 1.2 s" in _shown(status), 10, "the load progress")
            assert app.query_one("#loading").display
            await _type_and_send(pilot, "hello")
            await wait_for(pilot, lambda: _assistants(app), 10, "the waiting reply")
            # Sent, not refused: the message is in the chat, the box is empty, the reply waits visibly.
            assert app.backend is None
            assert app.query_one("#prompt", PromptInput).text == ""
            assert [(m.role, m.content) for m in app.store.messages(app.chat_id)] == [("user", "hello")]
            assert "queued" in _shown(_assistants(app)[-1].query_one(".stats"))
            assert "your message is queued" in _shown(status)
            assert backend.requests.empty()
            load.release.set()
            await wait_for(pilot, lambda: not app.generating and app.backend is not None, 10, "the answer")
            stored = app.store.messages(app.chat_id)
            assert [m.role for m in stored] == ["user", "assistant"]
            assert stored[-1].content == events[-1].text and stored[-1].meta["finish_reason"] == "stop"
            assert backend.requests.get_nowait().messages[-1].content == "hello"
            assert len(_assistants(app)) == 1 and "tok/s" in _shown(_assistants(app)[-1].query_one(".stats"))
    finally:
        load.release.set()


async def test_escape_takes_a_queued_message_back(tmp_path):
    backend = demo_backend()
    load = GatedLoad(backend)
    app = _app(tmp_path, load)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _type_and_send(pilot, "never mind")
            await wait_for(pilot, lambda: app.generating, 10, "the queued reply")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.generating and not _assistants(app), 10, "the cancel")
            load.release.set()
            await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
            await pilot.pause()
            assert backend.requests.empty()  # nothing was sent
            assert [m.role for m in app.store.messages(app.chat_id)] == ["user"]
            await pilot.press("ctrl+r")  # answers it now
            await wait_for(pilot, lambda: len(app.store.messages(app.chat_id)) == 2 and not app.generating, 10)
            assert backend.requests.get_nowait().messages[-1].content == "never mind"
    finally:
        load.release.set()


async def test_a_failed_load_frees_a_queued_message(tmp_path):
    load = GatedLoad(demo_backend(), error=LocalspecError("The model file is corrupt.", "Pull it again."))
    app = _app(tmp_path, load)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _type_and_send(pilot, "hello")
            await wait_for(pilot, lambda: app.generating, 10, "the queued reply")
            load.release.set()
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), 10, "the error")
            await wait_for(pilot, lambda: not app.generating and not _assistants(app), 10, "the waiting reply gone")
            assert [m.content for m in app.store.messages(app.chat_id)] == ["hello"]
            assert any("was not sent" in str(n.message) for n in app._notifications)
    finally:
        load.release.set()


async def test_calibration_finishing_is_said_with_its_duration(tmp_path):
    steps = (LoadProgress(LoadStage.CALIBRATE, "qwen-test", 0.5, 6.0),
             LoadProgress(LoadStage.CALIBRATE, "qwen-test", 1.0, 12.34))
    load = GatedLoad(demo_backend(), progress=steps)
    app = _app(tmp_path, load)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: any("Calibrated speculative costs in 12.3 s" in str(n.message)
                                              for n in app._notifications), 10, "the calibration notice")
            assert "calibrating speculative costs (one-time) 100%" in _shown(app.query_one("#status"))
            load.release.set()
            await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
    finally:
        load.release.set()


# ---------------------------------------------------------------------- interrupted replies


def test_a_streaming_reply_is_saved_throttled_not_per_token(tmp_path):
    now = [100.0]
    store = ChatStore(tmp_path / "c.sqlite")
    chat = store.create_chat()
    row = store.add_message(chat.id, "assistant", "", {})
    partial = PartialReply(store, row.id, every_s=0.5, clock=lambda: now[0])
    saved = [partial.grew("a", [["a", "target"]])]  # the first token at once
    now[0] += 0.2
    saved.append(partial.grew("ab", [["ab", "target"]]))
    now[0] += 0.4
    saved.append(partial.grew("abc", [["abc", "target"]]))
    assert saved == [True, False, True]
    stored = store.messages(chat.id)[0]
    assert stored.content == "abc" and stored.meta == {"interrupted": True, "segments": [["abc", "target"]]}


async def test_closing_the_app_mid_reply_keeps_the_partial_answer_marked_interrupted(tmp_path):
    app = _app(tmp_path, lambda _p, **_: ReplayBackend([slow_reply(400)], delay=0.02))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await app.send("count")
        await wait_for(pilot, lambda: _assistants(app) and len(_assistants(app)[-1].content) >= 12, 10, "tokens")
        chat_id = app.chat_id
    # The app ended while the reply streamed: its row holds what had arrived, marked interrupted.
    store = ChatStore(tmp_path / "chats.sqlite")
    kept = store.messages(chat_id)
    store.close()
    assert [m.role for m in kept] == ["user", "assistant"]
    assert kept[1].meta.get("interrupted") is True and "finish_reason" not in kept[1].meta
    assert len(kept[1].content) >= 12 and slow_reply(400)[-1].text.startswith(kept[1].content)
    await _reopen_and_check(tmp_path, chat_id, kept[1].content)


async def _reopen_and_check(tmp_path: Path, chat_id: int, partial: str) -> None:
    """A new app shows the partial answer marked interrupted; Ctrl+R replaces it with a whole one."""
    backend = demo_backend()
    app = _app(tmp_path, lambda _p, **_: backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.query(MessageView)) == 2, 10, "the history")
        assert app.chat_id == chat_id
        view = _assistants(app)[-1]
        assert view.content == partial
        assert view.has_class("interrupted") and "interrupted" in _shown(view.query_one(".stats"))
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.generating and app.store.messages(chat_id)[-1].meta.get("stats"),
                       10, "the regenerated reply")
        stored = app.store.messages(chat_id)
        assert [m.role for m in stored] == ["user", "assistant"] and "interrupted" not in stored[-1].meta
        assert not _assistants(app)[-1].has_class("interrupted")


def _assistant_row(db: Path) -> tuple[str, dict] | None:
    """Read the reply's row as another process sees it (read-only; the app may be writing)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            row = conn.execute("SELECT content, meta FROM messages WHERE role = 'assistant'").fetchone()
    except sqlite3.OperationalError:  # the app has not created the file or tables yet
        return None
    return (row[0], json.loads(row[1])) if row else None


def _poll(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while (value := predicate()) is None or value is False:
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


async def test_a_killed_app_reopens_with_the_partial_answer_marked_interrupted(tmp_path):
    """SIGKILL: no handler runs, so only what was written while the reply streamed survives."""
    db = tmp_path / "chats.sqlite"
    child = subprocess.Popen([sys.executable, "-m", "tests.tui_kill_child", str(db)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # At least two saves: the first token's, then a throttled one ~0.5 s later.
        _poll(lambda: child.poll() is None and (row := _assistant_row(db)) is not None and len(row[0]) > 40,
              60, "the reply streaming into the database")
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")[-2000:]
    content, meta = _assistant_row(db)
    assert meta.get("interrupted") is True and "finish_reason" not in meta
    assert len(content) > 40 and slow_reply()[-1].text.startswith(content)
    store = ChatStore(db)
    chat_id = store.list_chats()[0].id
    store.close()
    await _reopen_and_check(tmp_path, chat_id, content)
