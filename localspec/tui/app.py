"""The localspec chat app: one `ChatScreen` (chats, conversation, metrics) plus the models screen.

Replies come from a `Backend` (in-process engine, remote endpoint, or a recording). The app holds
what outlives a screen (the store, the session metrics, the active profile, the theme) and the
global keys; the chat screen and its controllers do the rest (see `chat_screen.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.theme import Theme

from localspec.models import ModelRow
from localspec.paths import resolve_paths
from localspec.tui.backend import Backend, BackendFactory
from localspec.tui.chat_screen import GLOBAL_ACTIONS, KEYS, ChatScreen
from localspec.tui.dialogs import HelpScreen
from localspec.tui.models_screen import ModelsChanged, ModelsScreen
from localspec.tui.safe_text import terminal_safe
from localspec.tui.session_metrics import SessionMetrics
from localspec.tui.store import ChatParams, ChatStore, ChatStoreBusy
from localspec.tui.widgets import NEWLINE_KEYS

__all__ = ["KEYS", "ChatApp"]

CSS = """
#sidebar { width: 24; border-right: solid $primary-background; }
#sidebar.-hidden { display: none; }
#chat-list { height: 1fr; }
.pane-title { text-style: bold; color: $accent; padding: 0 1; }
#chat { width: 1fr; }
#messages { height: 1fr; padding: 0 1; }
.message { height: auto; margin: 1 0 0 0; padding: 0 1; }
.message:focus { background: $boost; }
.message.user { border-left: thick $secondary; }
.message.assistant { border-left: thick $primary; }
.message .role { text-style: bold; color: $text-muted; }
.message.interrupted .stats { color: $warning; }
.message Markdown { margin: 0; padding: 0; }
.message .origins { padding: 0 0 1 0; }
.message .thought { margin: 0; padding: 0; border: none; background: transparent; }
.message .thought Contents { padding: 0 0 0 2; }
.message .thought-body { color: $text-muted; }
.reply-footer { height: auto; color: $text-muted; }
.reply-footer .stats { width: 1fr; }
.reply-footer Label { margin-left: 1; }
.badge { background: $success; color: $background; padding: 0 1; }
.route { color: $text-disabled; }
#status-bar { height: auto; max-height: 3; padding: 0 1; }
#status-bar LoadingIndicator { width: 8; height: 1; }
#status { color: $text-muted; }
#prompt { height: auto; min-height: 3; max-height: 10; }
#metrics { width: 38; border-left: solid $primary-background; padding: 0 1; display: none; }
#metrics.-visible { display: block; }
#metrics Sparkline { height: 2; margin-bottom: 1; }
.dialog { width: 70; height: auto; max-height: 90%; padding: 1 2; border: thick $primary; background: $surface; }
.dialog.error { border: thick $error; }
.dialog.help { width: 80; }
.dialog-title { text-style: bold; margin-bottom: 1; }
.dialog .buttons { height: auto; margin-top: 1; }
.dialog .buttons Button { margin-right: 2; }
.dialog TextArea { height: 6; }
.fix { color: $warning; }
ModalScreen { align: center middle; }
#models-body { padding: 0 1; }
#models-table { height: 1fr; }
#pull-status { height: auto; margin-top: 1; }
"""


class ChatApp(App[None]):
    TITLE = "localspec"
    CSS = CSS
    BINDINGS = [Binding(k, a, label, show=show, tooltip=d) for k, a, label, d, show in KEYS if a in GLOBAL_ACTIONS]

    def __init__(
        self,
        backend_factory: BackendFactory,
        store: ChatStore | None = None,
        metrics: SessionMetrics | None = None,
        profile: str | None = None,
        memory_probe: Callable[[], int | None] | None = None,
        model_rows: Callable[[], list[ModelRow]] | None = None,
        export_dir: Path | None = None,
        new_chat_params: ChatParams | None = None,
    ) -> None:
        super().__init__()
        self.backend_factory = backend_factory
        self.store = store or ChatStore()
        self.metrics = metrics or SessionMetrics()
        self.memory_probe = memory_probe or _process_rss
        self.model_rows = model_rows
        self.export_dir = export_dir or resolve_paths().data_dir / "exports"
        self.new_chat_params = new_chat_params
        self.active_profile = profile or self.store.get_pref("active_profile")
        self.chat_screen = ChatScreen()

    def get_default_screen(self) -> Screen[None]:
        return self.chat_screen

    # What callers and tests read: the chat screen's state, by its old names.
    @property
    def backend(self) -> Backend | None:
        return self.chat_screen.loader.backend

    @property
    def generating(self) -> bool:
        return self.chat_screen.replies.generating

    @property
    def chat_id(self) -> int | None:
        return self.chat_screen.chats.chat_id

    async def send(self, text: str) -> None:
        await self.chat_screen.replies.send(text)

    def on_mount(self) -> None:
        theme = self.store.get_pref("theme")
        if theme and theme in self.available_themes:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, self._save_theme)

    def _save_theme(self, theme: Theme) -> None:
        try:
            self.store.set_pref("theme", theme.name)
        except ChatStoreBusy as exc:  # another program holds chats.sqlite: the theme applies, unsaved
            self.notify(str(exc), title="Theme not saved", severity="warning")

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Toasts carry chat titles, model ids and error text: never parsed as markup, whatever the
        caller asks (Textual's widgets and screens ask for markup by default), nor as control characters."""
        super().notify(terminal_safe(message), title=terminal_safe(title), severity=severity, timeout=timeout,
                       markup=False)

    # ------------------------------------------------------------------ profiles and models

    def on_models_changed(self, _: ModelsChanged) -> None:
        loader = self.chat_screen.loader
        if loader.backend is None and not loader.loading:
            loader.load(self.active_profile)

    def set_active_profile(self, name: str) -> None:
        """The choice is settings.toml's `profile`, so that `serve` and `generate` use it too."""
        from localspec.errors import LocalspecError
        from localspec.settings import write_profile

        self.active_profile = name
        with contextlib.suppress(ChatStoreBusy):  # settings.toml (below) is what counts
            self.store.set_pref("active_profile", name)  # what older versions read
        try:
            write_profile(name)
        except LocalspecError as exc:
            self.notify(f"{exc}", title="Profile not saved", severity="warning")
        loader = self.chat_screen.loader
        if loader.backend is None or loader.backend.info.kind == "in-process":
            loader.load(name)

    def action_models(self) -> None:
        if not isinstance(self.screen, ModelsScreen):
            self.push_screen(ModelsScreen(self.model_rows, self.active_profile))

    def action_help(self) -> None:
        keys = [("enter", "Send the message"), (" / ".join(NEWLINE_KEYS), "New line in the message")]
        keys += [(k, d) for k, _, _, d, _ in KEYS]
        keys += [("ctrl+p", "Command palette (every action, themes)"), ("ctrl+q", "Quit")]
        self.push_screen(HelpScreen(keys))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for _, action, _, description, _ in KEYS:
            target = self if action in GLOBAL_ACTIONS else self.chat_screen
            yield SystemCommand(description, f"localspec: {description.lower()}", _runner(self, action, target))

    # ------------------------------------------------------------------ shutdown

    async def on_unmount(self) -> None:
        self.chat_screen.replies.close()
        self.workers.cancel_all()
        loader = self.chat_screen.loader
        if loader.backend is not None:
            loader.backend.close()
            loader.backend = None
        self.store.close()
        self.metrics.close()


def _runner(app: ChatApp, action: str, target: App[None] | Screen[None]) -> Callable[[], object]:
    async def run() -> None:
        await app.run_action(action, target)

    return run


def _process_rss() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None
