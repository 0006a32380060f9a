"""The chat app costs the engine nothing per token: tokens cross threads and reach the view in
frames (at most FRAMES_PER_S a second), not one call per token.

A scripted backend emits thousands of tokens as fast as a thread can; the test counts every
cross-thread wake-up of the app's event loop (`call_soon_threadsafe`: what `call_from_thread` and a
`post_message` from another thread both use) and every Markdown write while the reply streams.
Both must be bounded by the reply's frames (its duration x FRAMES_PER_S, plus a few for the start
and the end), far below the token count. The duration is only an upper bound on the frames; nothing
here asserts a speed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from textual.widgets._markdown import MarkdownStream

from localspec.engine.events import Done, Stats, Token
from localspec.tui import ChatApp, ChatStore, ReplayBackend
from localspec.tui.widgets import MessageView
from tests.tui_support import wait_for

TOKENS = 4000
FRAMES_PER_S = 30  # the bound on the chat app's render rate
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _fast_reply(n: int = TOKENS) -> list:
    tokens = [Token(f"w{i} " if i % 50 else f"w{i}\n\n", (i,), "draft" if i % 3 else "target") for i in range(n)]
    text = "".join(t.text for t in tokens)
    return [*tokens, Done("stop", Stats(mode="draft", completion_tokens=n, decode_ms=100.0), text)], text


class _Counts:
    def __init__(self) -> None:
        self.cross_thread = 0
        self.writes = 0


async def test_tokens_reach_the_view_in_frames_not_one_call_per_token(tmp_path: Path, monkeypatch):
    events, text = _fast_reply()
    app = ChatApp(lambda _p, **_: ReplayBackend([events]), store=ChatStore(tmp_path / "chats.sqlite"),
                  memory_probe=lambda: 0, export_dir=tmp_path / "exports")
    counts = _Counts()
    original_write = MarkdownStream.write

    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        loop = asyncio.get_running_loop()
        threadsafe = loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            counts.cross_thread += 1
            return threadsafe(*args, **kwargs)

        async def counting_write(stream, fragment: str) -> None:
            counts.writes += 1
            await original_write(stream, fragment)

        monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
        monkeypatch.setattr(MarkdownStream, "write", counting_write)
        started = time.monotonic()
        await app.send("count")
        await wait_for(pilot, lambda: not app.generating, 60, "the reply")
        elapsed = time.monotonic() - started
        monkeypatch.undo()
        stored = app.store.messages(app.chat_id)[-1]
        view = [v for v in app.query(MessageView) if v.role == "assistant"][-1]

    # Same text as the backend produced, to the last token, in the store and in the view.
    assert stored.content == text and view.content == text
    assert "".join(s for s, _ in stored.meta["segments"]) == text
    frames = elapsed * FRAMES_PER_S + 5
    assert counts.cross_thread <= frames, (counts.cross_thread, elapsed)
    assert counts.writes <= frames, (counts.writes, elapsed)
    assert counts.cross_thread < TOKENS / 20 and counts.writes < TOKENS / 20, vars(counts)


def test_frames_wait_for_the_cap_and_for_the_ui_cpu_budget():
    from localspec.tui.streaming import FramePacer

    now, cpu = [0.0], [0.0]
    pacer = FramePacer(fps=30, share=0.1, max_gap=0.5, clock=lambda: now[0], cpu=lambda: cpu[0])
    now[0] = 0.01
    assert not pacer.due()  # sooner than 1/30 s
    now[0] = 0.04
    assert pacer.due()  # a cheap frame: the cap binds
    cpu[0] += 0.03  # that frame cost 30 ms of UI time: the next waits 0.3 s, not 1/30 s
    now[0] = 0.2
    assert not pacer.due()
    now[0] = 0.341
    assert pacer.due()
    cpu[0] += 1.0  # the UI thread was busy for a second: the reply still moves after max_gap
    now[0] = 0.8
    assert not pacer.due()
    now[0] = 0.842
    assert pacer.due()
