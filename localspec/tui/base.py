"""What the chat screen's controllers share: the screen they act on and a safe post from a thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.message import Message as TextualMessage

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp
    from localspec.tui.chat_screen import ChatScreen
    from localspec.tui.store import ChatStore


class ScreenPart:
    """One concern of the chat screen (loading, chats, replies, reply tools): state plus the code
    that changes it. Runs on the UI thread; background threads reach it only through `post`."""

    def __init__(self, screen: ChatScreen) -> None:
        self.screen = screen

    @property
    def app(self) -> ChatApp:
        return cast("ChatApp", self.screen.app)

    @property
    def store(self) -> ChatStore:
        return self.app.store

    def post(self, message: TextualMessage) -> bool:
        """Thread-safe: queue `message` for the screen. False once the app has closed."""
        try:
            return self.screen.post_message(message)
        except RuntimeError:  # the event loop closed meanwhile
            return False
