"""The chat screen: chats on the left, the conversation in the middle, metrics on the right.

The screen lays the widgets out, maps keys to its controllers and hands them the messages that
background threads post. Each controller holds one concern's state and code:

* `loader`: the backend and its loading thread (`loading.py`),
* `chats`: which chat is open; new, rename, delete, export, settings (`chats.py`),
* `replies`: send, stream, cancel, regenerate, edit (`replies.py`),
* `tools`: copy, cache verdicts, the accepted-token view (`reply_tools.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Label, ListView, LoadingIndicator, Markdown

from localspec.engine.events import Done
from localspec.tui.backend import Generation
from localspec.tui.chats import Chats
from localspec.tui.dialogs import ConfirmDialog
from localspec.tui.loading import (
    BackendReady,
    Loader,
    LoadFailed,
    LoadProgressed,
    ModelsMissing,
)
from localspec.tui.replies import Replies
from localspec.tui.safe_text import terminal_safe
from localspec.tui.reply_tools import ReplyTools
from localspec.tui.streaming import ContextTrimmed, ReplyEnded, ReplyRefused, ServerGone
from localspec.tui.widgets import MessageView, MetricsPane, PromptInput

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp

# (key, action, footer label, description, show in footer). Help screen and palette read this too.
KEYS: list[tuple[str, str, str, str, bool]] = [
    ("escape", "cancel", "Cancel", "Cancel the running reply", True),
    ("ctrl+r", "regenerate", "Regenerate", "Regenerate the last answer", True),
    ("ctrl+o", "edit_last", "Edit", "Edit and resend a message", False),
    ("ctrl+t", "toggle_origins", "Tokens", "Accepted-token view (draft, prediction, target)", True),
    ("ctrl+g", "toggle_metrics", "Metrics", "Metrics pane", True),
    ("ctrl+n", "new_chat", "New", "New chat", True),
    ("f2", "rename_chat", "Rename", "Rename chat", False),
    ("f8", "delete_chat", "Delete", "Delete chat", False),
    ("f4", "export_chat", "Export", "Export chat to Markdown", False),
    ("ctrl+s", "chat_settings", "Settings", "Chat settings (system prompt, parameters)", True),
    ("ctrl+l", "models", "Models", "Models screen", True),
    ("ctrl+b", "toggle_sidebar", "Chats", "Show or hide the chat list", False),
    ("f9", "copy_message", "Copy", "Copy the selected (or last) reply", False),
    ("f10", "copy_code", "Copy code", "Copy the last code block of that reply", False),
    ("f3", "mark_wrong", "Wrong", "Mark the selected (or last) cached reply wrong: evicts it from the cache", False),
    ("f1", "help", "Help", "Key bindings", True),
]
GLOBAL_ACTIONS = {"help", "models"}  # the app's; the rest act on the chat screen only
WEB_SCHEMES = ("http", "https")  # what a link in a message may open


class ChatScreen(Screen[None]):
    BINDINGS = [Binding(k, a, label, show=show, tooltip=d) for k, a, label, d, show in KEYS if a not in GLOBAL_ACTIONS]

    def __init__(self) -> None:
        super().__init__()
        self.loader = Loader(self)
        self.chats = Chats(self)
        self.replies = Replies(self)
        self.tools = ReplyTools(self)

    @property
    def chat_app(self) -> ChatApp:
        return cast("ChatApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≡")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Label("Chats  (ctrl+n new)", classes="pane-title")
                yield ListView(id="chat-list")
            with Vertical(id="chat"):
                yield VerticalScroll(id="messages")
                with Horizontal(id="status-bar"):
                    yield LoadingIndicator(id="loading")
                    yield Label("", id="status", markup=False)
                prompt = PromptInput(id="prompt", soft_wrap=True, show_line_numbers=False)
                prompt.border_title = "Message"
                prompt.border_subtitle = "Enter send · Ctrl+J newline · Esc cancel"
                yield prompt
            yield MetricsPane(id="metrics")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#messages", VerticalScroll).anchor()
        await self.chats.open_first()
        self.focus_prompt()
        self.refresh_metrics()
        self.set_interval(2.0, self._tick)
        self.loader.load(self.chat_app.active_profile)

    # ------------------------------------------------------------------ messages from threads

    def on_load_progressed(self, message: LoadProgressed) -> None:
        self.loader.progressed(message)

    def on_backend_ready(self, message: BackendReady) -> None:
        if self.loader.ready(message):
            self.refresh_metrics()
            if self.replies.queued is not None:
                self.call_later(self.replies.start_queued)

    async def on_load_failed(self, message: LoadFailed) -> None:
        if await self.loader.failed(message):
            self.replies.drop_queued()

    async def on_models_missing(self, message: ModelsMissing) -> None:
        if await self.loader.missing(message):
            self.replies.drop_queued()

    async def on_reply_ended(self, message: ReplyEnded) -> None:
        await self.replies.ended(message)

    async def on_reply_refused(self, message: ReplyRefused) -> None:
        await self.replies.refused(message)

    def on_server_gone(self, message: ServerGone) -> None:
        self.replies.server_gone(message)

    def on_context_trimmed(self, message: ContextTrimmed) -> None:
        self.app.notify(f"The chat is longer than the context: the {message.dropped} oldest message(s) "
                        "were left out of this reply.", title="Context full", severity="warning", timeout=8)

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.replies.send(event.text)

    @on(Markdown.LinkClicked)
    def _link_clicked(self, event: Markdown.LinkClicked) -> None:
        self.open_link(event.href)

    @on(Button.Pressed, "#earlier")
    async def _show_earlier(self) -> None:
        await self.chats.show_earlier()

    @on(ListView.Selected, "#chat-list")
    async def _chat_selected(self, event: ListView.Selected) -> None:
        await self.chats.selected(event.item)

    # ------------------------------------------------------------------ keys

    async def action_cancel(self) -> None:
        await self.replies.cancel()

    async def action_regenerate(self) -> None:
        await self.replies.regenerate()

    async def action_edit_last(self) -> None:
        await self.replies.edit_last()

    def action_toggle_origins(self) -> None:
        self.tools.toggle_origins()

    def action_toggle_metrics(self) -> None:
        self.query_one("#metrics").toggle_class("-visible")
        self.refresh_metrics()

    async def action_new_chat(self) -> None:
        await self.chats.new()

    def action_rename_chat(self) -> None:
        self.chats.ask_rename()

    def action_delete_chat(self) -> None:
        self.chats.ask_delete()

    def action_export_chat(self) -> None:
        self.chats.export()

    def action_chat_settings(self) -> None:
        self.chats.edit_settings()

    def action_toggle_sidebar(self) -> None:
        self.query_one("#sidebar").toggle_class("-hidden")

    def action_copy_message(self) -> None:
        self.tools.copy_message()

    def action_copy_code(self) -> None:
        self.tools.copy_code()

    async def action_mark_wrong(self) -> None:
        await self.tools.mark_wrong()

    def open_link(self, href: str) -> None:
        """A link in a message opens only after the user has seen the whole address and said yes,
        and only a web one: the browser hands other schemes (ssh:, smb:, an app's own) to programs."""
        if urlsplit(href).scheme.lower() not in WEB_SCHEMES:
            self.app.notify(f"Not opened: {href} is not a web link.", title="Link", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.open_url(href)

        self.app.push_screen(ConfirmDialog(f"Open this link in your browser?\n\n{href}", yes="Open"), answered)

    # ------------------------------------------------------------------ shared by the controllers

    def focus_prompt(self) -> None:
        self.query_one("#prompt").focus()

    def set_status(self, text: str, loading: bool = False) -> None:
        self.query_one("#status", Label).update(terminal_safe(text))  # model ids and servers' words
        self.query_one("#loading").display = loading

    def show_loading(self) -> None:
        self.set_status(self.loader.status(queued=self.replies.queued is not None), True)

    def message_views(self) -> list[MessageView]:
        return list(self.query_one("#messages").query(MessageView))

    def target_view(self, role: str) -> MessageView | None:
        """The focused message of that role, else the last one."""
        focused = self.focused
        if isinstance(focused, MessageView) and focused.role == role and focused.message_id is not None:
            return focused
        views = [v for v in self.message_views() if v.role == role and v.message_id is not None]
        return views[-1] if views else None

    def record_reply(self, done: Done, generation: Generation, *, e2e_ms: float) -> None:
        info = self.loader.backend.info if self.loader.backend else None
        self.chat_app.metrics.record(
            done.stats, done.finish_reason, cached=generation.cached, route=generation.route,
            profile=info.profile if info else None, target=info.target if info else None,
            draft=info.draft if info else None, e2e_ms=e2e_ms, log=not (info and info.logged_by_server),
        )
        self.refresh_metrics()

    def refresh_metrics(self) -> None:
        pane = self.query_one("#metrics", MetricsPane)
        info = self.loader.backend.info if self.loader.backend else None
        app = self.chat_app
        pane.show(app.metrics.snapshot(), info, app.memory_probe())

    def _tick(self) -> None:
        try:
            if self.query_one("#metrics").has_class("-visible"):
                self.refresh_metrics()
        except NoMatches:  # the interval fired while the app was tearing its widgets down on exit
            return
