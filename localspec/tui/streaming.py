"""A reply on its way from the worker thread to the view: the token buffer, the reply's state and
the typed messages the thread posts to the screen.

The thread only appends to the buffer; the screen drains it on a timer at most FRAMES_PER_S times
a second (see `replies.py`), so nothing per token crosses threads one call at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from textual.message import Message as TextualMessage
from textual.timer import Timer

from localspec.engine.events import Done, Token
from localspec.errors import LocalspecError
from localspec.tui.backend import Generation
from localspec.tui.store import PartialReply
from localspec.tui.widgets import MessageView

FRAMES_PER_S = 30  # the most frames a second a streaming reply draws
# The most of one core the UI thread may spend while a reply streams. With llama.cpp's threads on
# every core, any work beside them stalls their per-op barriers, so the view yields: on a fast
# machine the frame cap binds, on a busy 2-core CPU (a frame there costs ~30 ms of layout and
# render) frames come a few times a second and the engine keeps its speed.
UI_CPU_SHARE = 0.1
MAX_FRAME_GAP_S = 0.5  # but a reply still moves twice a second, however busy the UI thread is


class FramePacer:
    """Says when the next frame may draw: at most `fps` a second, and only once the UI thread's CPU
    time since the last frame is at most `share` of the wall time since then (the last frame's
    layout and render, mostly), though never more than `max_gap` seconds after it."""

    def __init__(self, *, fps: float = FRAMES_PER_S, share: float = UI_CPU_SHARE, max_gap: float = MAX_FRAME_GAP_S,
                 clock: Callable[[], float] = time.perf_counter, cpu: Callable[[], float] = time.thread_time) -> None:
        self._min_gap, self._max_gap, self._share = 1 / fps, max_gap, share
        self._clock, self._cpu = clock, cpu
        self._last_at, self._last_cpu = clock(), cpu()

    def due(self) -> bool:
        """Call on the UI thread; True starts a frame (and its accounting)."""
        now, cpu = self._clock(), self._cpu()
        gap = min(self._max_gap, max(self._min_gap, (cpu - self._last_cpu) / self._share))
        if now - self._last_at < gap:
            return False
        self._last_at, self._last_cpu = now, cpu
        return True


class TokenBuffer:
    """Tokens the worker thread has produced and the view has not shown yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: list[Token] = []

    def push(self, token: Token) -> None:
        with self._lock:
            self._tokens.append(token)

    def drain(self) -> list[Token]:
        with self._lock:
            tokens, self._tokens = self._tokens, []
        return tokens


@dataclass
class Reply:
    """One answer under way: its view, its row in the store and its link to the worker thread."""

    view: MessageView
    chat_id: int
    partial: PartialReply
    started: float = field(default_factory=time.perf_counter)
    buffer: TokenBuffer = field(default_factory=TokenBuffer)
    pacer: FramePacer = field(default_factory=FramePacer)
    frames: Timer | None = None
    _generation: Generation | None = None
    _cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, generation: Generation) -> None:
        """The worker thread's generation; an Esc pressed before it existed cancels it now."""
        with self._lock:
            self._generation = generation
            cancelled = self._cancelled
        if cancelled:
            generation.cancel()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            generation = self._generation
        if generation is not None:
            generation.cancel()


class ReplyEnded(TextualMessage):
    def __init__(self, reply: Reply, done: Done, generation: Generation) -> None:
        super().__init__()
        self.reply, self.done, self.generation = reply, done, generation


class ReplyRefused(TextualMessage):
    """The backend would not start the reply (e.g. the chat does not fit the context)."""

    def __init__(self, reply: Reply, error: LocalspecError) -> None:
        super().__init__()
        self.reply, self.error = reply, error


class ServerGone(TextualMessage):
    """The attached server no longer answers as localspec: the reply was not sent, and waits for
    the models to load in this process."""

    def __init__(self, reply: Reply, error: LocalspecError) -> None:
        super().__init__()
        self.reply, self.error = reply, error


class ContextTrimmed(TextualMessage):
    def __init__(self, dropped: int) -> None:
        super().__init__()
        self.dropped = dropped
