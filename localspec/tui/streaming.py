"""A reply on its way from the worker thread to the view: the token buffer, the reply's state and
the typed messages the thread posts to the screen.

The thread only appends to the buffer; the screen drains it on a timer at most FRAMES_PER_S times
a second (see `replies.py`), so nothing per token crosses threads one call at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from textual.message import Message as TextualMessage
from textual.timer import Timer

from localspec.engine.events import Done, Token
from localspec.errors import LocalspecError
from localspec.tui.backend import Generation
from localspec.tui.store import PartialReply
from localspec.tui.widgets import MessageView

FRAMES_PER_S = 30  # the view's refresh rate while a reply streams


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


class ContextTrimmed(TextualMessage):
    def __init__(self, dropped: int) -> None:
        super().__init__()
        self.dropped = dropped
