"""The localspec chat app: chats on the left, the conversation in the middle, metrics on the right.

Replies come from a `Backend` (in-process engine, remote endpoint, or a recording) and stream into
the message list from a worker thread, so the UI never waits on the model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Header, Label, ListItem, ListView, LoadingIndicator

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, LoadProgress, LoadStage, Token
from localspec.engine.sampling import SamplingParams
from localspec.errors import LocalspecError, ModelNotFoundError
from localspec.models import ModelRow
from localspec.paths import resolve_paths
from localspec.tui.backend import Backend, BackendFactory, Generation
from localspec.tui.dialogs import ChatSettingsDialog, ConfirmDialog, ErrorDialog, HelpScreen, TextPrompt
from localspec.tui.loading import LoadProgressed, calibrated_notice, loading_status
from localspec.tui.models_screen import ModelsChanged, ModelsScreen
from localspec.tui.session_metrics import SessionMetrics
from localspec.tui.store import ChatParams, ChatStore, PartialReply, export_chat, interrupted_meta
from localspec.tui.widgets import NEWLINE_KEYS, MessageView, MetricsPane, PromptInput, code_blocks

logger = logging.getLogger(__name__)

# (key, action, footer label, description, show in footer). Help screen and palette read this too.
KEYS: list[tuple[str, str, str, str, bool]] = [
    ("escape", "cancel", "Cancel", "Cancel the running reply", True),
    ("ctrl+r", "regenerate", "Regenerate", "Regenerate the last answer", True),
    ("ctrl+o", "edit_last", "Edit", "Edit and resend a message", False),
    ("ctrl+t", "toggle_origins", "Tokens", "Accepted-token view (draft vs target)", True),
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
_GLOBAL_ACTIONS = {"help", "models"}  # the rest act on the chat screen only

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


class ChatApp(App):
    TITLE = "localspec"
    CSS = CSS
    BINDINGS = [Binding(k, a, label, show=show, tooltip=d) for k, a, label, d, show in KEYS]

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
        self.backend: Backend | None = None
        self.chat_id: int | None = None
        self.generation: Generation | None = None
        self.generating = False
        self.show_origins = False
        self.loading = False
        self._load_number = 0  # which load LoadProgressed messages must belong to
        self._load_profile: str | None = None
        self._load_progress: LoadProgress | None = None
        self._queued: MessageView | None = None  # a reply waiting for the models to load
        self._partial: PartialReply | None = None  # the streaming reply's row, kept up to date

    # ------------------------------------------------------------------ layout

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
        theme = self.store.get_pref("theme")
        if theme and theme in self.available_themes:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, lambda t: self.store.set_pref("theme", t.name))
        self.query_one("#messages", VerticalScroll).anchor()
        chats = self.store.list_chats()
        last = self.store.get_pref("last_chat")
        ids = [c.id for c in chats]
        if last and int(last) in ids:
            chat_id = int(last)
        elif chats:
            chat_id = chats[0].id
        else:
            chat_id = self.store.create_chat(params=self.new_chat_params).id
        await self.refresh_chat_list()
        await self.open_chat(chat_id)
        self.query_one("#prompt").focus()
        self.refresh_metrics()
        self.set_interval(2.0, self._tick)
        self.load_backend(self.active_profile)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Toasts carry chat titles, model ids and error text: never parsed as markup, whatever the
        caller asks (Textual's widgets and screens ask for markup by default)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def _tick(self) -> None:
        try:
            if self.query_one("#metrics").has_class("-visible"):
                self.refresh_metrics()
        except NoMatches:  # the interval fired while the app was tearing its widgets down on exit
            return

    # ------------------------------------------------------------------ backend loading

    def _set_status(self, text: str, loading: bool = False) -> None:
        self.query_one("#status", Label).update(text)
        self.query_one("#loading").display = loading

    def load_backend(self, profile: str | None) -> None:
        self.loading = True
        self._load_number += 1
        self._load_profile, self._load_progress = profile, None
        self._show_loading()
        self._load_worker(profile, self._load_number)

    def _show_loading(self) -> None:
        self._set_status(loading_status(self._load_profile, self._load_progress, self._queued is not None), True)

    def on_load_progressed(self, message: LoadProgressed) -> None:
        if message.load != self._load_number or not self.loading:
            return  # from a load that was replaced
        self._load_progress = message.progress
        self._show_loading()
        if message.progress.stage is LoadStage.CALIBRATE and message.progress.finished:
            self.notify(calibrated_notice(message.progress), title="One-time set-up", timeout=8)

    @work(thread=True, group="load", exclusive=True)
    def _load_worker(self, profile: str | None, load: int) -> None:
        def on_progress(progress: LoadProgress) -> None:  # on the loading thread, inside llama.cpp's load
            try:
                self.post_message(LoadProgressed(progress, load))
            except RuntimeError:  # the app closed while the models loaded
                pass

        old, self.backend = self.backend, None
        try:
            if old is not None:
                old.close()
            backend = self.backend_factory(profile, on_progress=on_progress)
        except ModelNotFoundError as exc:
            self._from_thread(self._models_missing, profile, exc)
            return
        except LocalspecError as exc:
            self._from_thread(self._load_failed, exc)
            return
        except Exception as exc:  # a broken model file or build: say so, keep the app alive
            logger.exception("loading the backend failed")
            self._from_thread(self._load_failed, LocalspecError(f"Loading the models failed: {exc}."))
            return
        if not self._from_thread(self._backend_ready, backend, load):
            backend.close()  # the app closed while the models loaded

    def _from_thread(self, fn, *args, **kwargs) -> bool:
        try:
            self.call_from_thread(fn, *args, **kwargs)
            return True
        except RuntimeError:  # the app closed meanwhile
            return False

    def _backend_ready(self, backend: Backend, load: int) -> None:
        if load != self._load_number:  # a later load replaced this one
            backend.close()
            return
        self.backend = backend
        self.loading = False
        info = backend.info
        where = f"{info.kind} · {info.accelerator}"
        self._set_status(f"{info.target}" + (f" + draft {info.draft}" if info.draft else "") + f" · {where}")
        self.sub_title = info.target
        self.refresh_metrics()
        if self._queued is not None:
            self.call_later(self._start_queued)

    async def _start_queued(self) -> None:
        if self._queued is not None:  # still waiting (Esc may have cancelled it meanwhile)
            await self.start_reply(self._queued)

    def _drop_queued(self) -> None:
        """Loading failed: the waiting message stays in the chat, unanswered, and the app is free again."""
        view, self._queued = self._queued, None
        if view is not None:
            self.generating = False
            view.remove()
            self.notify("Your message was not sent: the models did not load. It stays in the chat; "
                        "Ctrl+R answers it once they are loaded.", severity="warning", timeout=10)

    def _load_failed(self, exc: LocalspecError) -> None:
        self.loading = False
        self._drop_queued()
        self._set_status(f"Not loaded: {exc.cause}")
        self.push_screen(ErrorDialog(exc.cause, exc.fix))

    def _models_missing(self, profile: str | None, exc: ModelNotFoundError) -> None:
        self.loading = False
        self._drop_queued()
        self._set_status("No models installed for this profile. Ctrl+L opens the models screen.")
        name = profile or "default"

        def answer(yes: bool | None) -> None:
            if yes:
                self.push_screen(ModelsScreen(self.model_rows, self.active_profile, pull_profile=profile or ""))

        self.push_screen(
            ConfirmDialog(f"{exc.cause}\n\nPull the models of the '{name}' profile now?", yes="Pull", no="Later"),
            answer,
        )

    def on_models_changed(self, _: ModelsChanged) -> None:
        if self.backend is None and not self.loading:
            self.load_backend(self.active_profile)

    def set_active_profile(self, name: str) -> None:
        self.active_profile = name
        self.store.set_pref("active_profile", name)
        if self.backend is None or self.backend.info.kind == "in-process":
            self.load_backend(name)

    # ------------------------------------------------------------------ chats

    async def refresh_chat_list(self) -> None:
        view = self.query_one("#chat-list", ListView)
        await view.clear()
        chats = self.store.list_chats()
        await view.extend(ListItem(Label(c.title, markup=False), id=f"chat-{c.id}") for c in chats)
        for i, c in enumerate(chats):
            if c.id == self.chat_id:
                view.index = i

    async def open_chat(self, chat_id: int) -> None:
        self.chat_id = chat_id
        self.store.set_pref("last_chat", str(chat_id))
        box = self.query_one("#messages", VerticalScroll)
        await box.remove_children()
        views = [MessageView(m.role, m.content, m.meta, m.id, self.show_origins) for m in self.store.messages(chat_id)]
        if views:
            await box.mount_all(views)
        self.title = f"localspec — {self.store.get_chat(chat_id).title}"
        box.scroll_end(animate=False)
        view = self.query_one("#chat-list", ListView)
        for i, item in enumerate(view.children):
            if item.id == f"chat-{chat_id}":
                view.index = i

    @on(ListView.Selected, "#chat-list")
    async def _chat_selected(self, event: ListView.Selected) -> None:
        chat_id = int((event.item.id or "chat-0").removeprefix("chat-"))
        if chat_id == self.chat_id:
            return
        if self.generating:
            self.notify("Wait for the reply to finish, or press Esc to cancel it.", severity="warning")
            return
        await self.open_chat(chat_id)
        self.query_one("#prompt").focus()

    async def action_new_chat(self) -> None:
        if self.generating:
            self.notify("Wait for the reply to finish, or press Esc to cancel it.", severity="warning")
            return
        chat = self.store.create_chat(params=self.new_chat_params)
        self.chat_id = chat.id
        await self.refresh_chat_list()
        await self.open_chat(chat.id)
        self.query_one("#prompt").focus()

    def action_rename_chat(self) -> None:
        chat = self.store.get_chat(self.chat_id)

        async def renamed(title: str | None) -> None:
            if title:
                self.store.rename_chat(chat.id, title)
                self.title = f"localspec — {title}"
                await self.refresh_chat_list()

        self.push_screen(TextPrompt("Rename chat", chat.title), renamed)

    def action_delete_chat(self) -> None:
        if self.generating:
            self.notify("Cancel the running reply first (Esc).", severity="warning")
            return
        chat = self.store.get_chat(self.chat_id)

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            self.store.delete_chat(chat.id)
            rest = self.store.list_chats()
            next_id = rest[0].id if rest else self.store.create_chat(params=self.new_chat_params).id
            self.chat_id = next_id
            await self.refresh_chat_list()
            await self.open_chat(next_id)
            self.notify(f"Deleted '{chat.title}'.")

        self.push_screen(ConfirmDialog(f"Delete the chat '{chat.title}' and its messages?", yes="Delete"), confirmed)

    def action_export_chat(self) -> None:
        chat = self.store.get_chat(self.chat_id)
        try:
            path = export_chat(chat, self.store.messages(chat.id), self.export_dir)
        except OSError as exc:
            self.notify(f"Export failed: {exc}", severity="error")
            return
        self.notify(f"Exported to {path}", title="Export")

    def action_chat_settings(self) -> None:
        chat = self.store.get_chat(self.chat_id)
        try:
            from localspec.models import ModelManager

            profiles = list(ModelManager().registry.profiles)
        except LocalspecError:
            profiles = []

        def saved(result) -> None:
            if result:
                system_prompt, params = result
                self.store.update_settings(chat.id, system_prompt, params)
                self.notify("Chat settings saved.")

        self.push_screen(ChatSettingsDialog(chat.system_prompt, chat.params, profiles), saved)

    # ------------------------------------------------------------------ sending

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> None:
        text = text.strip()
        if not text:
            return
        if self.generating:
            self.notify("Your last message is still waiting for the models (Esc cancels it)." if self._queued
                        else "A reply is still running (Esc cancels it).", severity="warning")
            return
        if self.backend is None and not self.loading:
            self.notify("No models loaded: Ctrl+L opens the models screen.", severity="warning")
            return
        chat = self.store.get_chat(self.chat_id)
        message = self.store.add_message(chat.id, "user", text)
        if chat.title == "New chat":
            title = text.splitlines()[0][:40]
            self.store.rename_chat(chat.id, title)
            self.title = f"localspec — {title}"
            await self.refresh_chat_list()
        self.query_one("#prompt", PromptInput).clear()
        await self.query_one("#messages").mount(MessageView("user", text, {}, message.id))
        await self.start_reply()

    def _wanted_profile(self) -> str | None:
        chat = self.store.get_chat(self.chat_id)
        return chat.params.profile or self.active_profile

    def _request(self) -> GenerationRequest:
        chat = self.store.get_chat(self.chat_id)
        p = chat.params
        messages = [{"role": "system", "content": chat.system_prompt}] if chat.system_prompt else []
        # An empty reply (interrupted before its first token) says nothing to the model.
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(chat.id)
                     if m.content or m.role != "assistant"]
        return GenerationRequest(
            messages=messages, max_tokens=p.max_tokens, sampling=SamplingParams(temperature=p.temperature),
            mode=p.mode, k=p.draft_k, truncate=True,
        )

    async def start_reply(self, view: MessageView | None = None) -> None:
        """Answer the chat's last message now, or once the models are loaded (`view`: the waiting reply)."""
        self._queued = None
        backend = self.backend
        wanted = self._wanted_profile()
        if (backend is not None and backend.info.kind == "in-process" and wanted
                and wanted != (backend.info.profile or self._default_profile())):
            self.notify(f"Loading profile '{wanted}' for this chat…")
            self.load_backend(wanted)
            backend = None
        self.generating = True  # set before any await: the reply is under way from here on
        if view is None:
            view = MessageView("assistant", "", None, None, self.show_origins)
            await self.query_one("#messages").mount(view)
            self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        if backend is None:  # the models are loading: the reply waits for them
            self._queued = view
            view.set_waiting(True)
            self._show_loading()
            return
        view.set_waiting(False)
        try:
            request = self._request()
        except ValueError as exc:  # pydantic: parameters out of range
            self.generating = False
            await view.remove()
            self.push_screen(ErrorDialog(f"Invalid chat parameters: {exc}.", "Fix them in chat settings (Ctrl+S)."))
            return
        # The reply has a row from its start, marked interrupted until it finishes: a killed app
        # reopens with what had streamed so far, marked, instead of a question without an answer.
        view.message_id = self.store.add_message(self.chat_id, "assistant", "", interrupted_meta([])).id
        self._partial = PartialReply(self.store, view.message_id)
        route = self.store.get_chat(self.chat_id).params.route  # the store belongs to this thread
        self._generate(backend, request, view, self.chat_id, route)

    def _default_profile(self) -> str | None:
        try:
            from localspec.models import ModelManager

            return ModelManager().registry.default_profile
        except LocalspecError:
            return None

    @work(thread=True, group="generate", exclusive=False)
    def _generate(self, backend: Backend, request: GenerationRequest, view: MessageView, chat_id: int,
                  route: str | None = None) -> None:
        started = time.perf_counter()
        try:
            generation = backend.start(request, route=route)
        except LocalspecError as exc:
            self._from_thread(self._reply_refused, view, exc)
            return
        except Exception as exc:
            logger.exception("starting a reply failed")
            self._from_thread(self._reply_refused, view, LocalspecError(f"The request failed: {exc}."))
            return
        self.generation = generation
        if generation.dropped_messages:
            self._from_thread(
                self.notify,
                f"The chat is longer than the context: the {generation.dropped_messages} oldest message(s) "
                "were left out of this reply.",
                title="Context full", severity="warning", timeout=8,
            )
        try:
            for event in generation:
                if isinstance(event, Token):
                    self._from_thread(self._add_token, view, event)
                elif isinstance(event, Done):
                    self._from_thread(self._reply_done, view, event, generation, chat_id, started)
        except Exception as exc:  # a backend that breaks mid-stream ends this reply only
            logger.exception("reply stream failed")
            from localspec.engine.events import Stats

            failed = Done("error", Stats(), view.content, str(exc))
            self._from_thread(self._reply_done, view, failed, generation, chat_id, started)

    async def _add_token(self, view: MessageView, token: Token) -> None:
        await view.add_token(token)
        if self._partial is not None and token.text:
            self._partial.grew(view.content, view.segments)

    def _forget_reply_row(self, view: MessageView) -> None:
        self._partial = None
        if view.message_id is not None:
            self.store.delete_message(view.message_id)
            view.message_id = None

    async def _reply_refused(self, view: MessageView, exc: LocalspecError) -> None:
        self.generating = False
        self.generation = None
        self._forget_reply_row(view)
        await view.remove()
        self.push_screen(ErrorDialog(exc.cause, exc.fix))

    async def _reply_done(self, view: MessageView, done: Done, generation: Generation, chat_id: int,
                          started: float) -> None:
        await view.finish(done, generation.cached, generation.route, getattr(generation, "cache_entry", None))
        self.generation = None
        self.generating = False
        info = self.backend.info if self.backend else None
        self.metrics.record(
            done.stats, done.finish_reason, cached=generation.cached, route=generation.route,
            profile=info.profile if info else None, target=info.target if info else None,
            draft=info.draft if info else None, e2e_ms=(time.perf_counter() - started) * 1000,
        )
        if done.text or done.finish_reason != "cancelled":
            self._partial = None
            self.store.update_message(view.message_id, view.content, view.meta)
            self.store.touch(chat_id)
        else:
            self._forget_reply_row(view)
            await view.remove()
        if done.finish_reason == "error":
            self.notify(f"Generation failed: {done.error}", title="Error", severity="error", timeout=10)
        elif done.finish_reason == "cancelled":
            self.notify("Reply cancelled.")
        self.refresh_metrics()

    async def action_cancel(self) -> None:
        if self._queued is not None:
            view, self._queued = self._queued, None
            self.generating = False
            await view.remove()
            self._show_loading()
            self.notify("Not sent: your message stays in the chat; Ctrl+R answers it once the models are loaded.")
        elif self.generation is not None:
            self.generation.cancel()

    # ------------------------------------------------------------------ regenerate, edit

    def _views(self) -> list[MessageView]:
        return list(self.query_one("#messages").query(MessageView))

    def _target_view(self, role: str) -> MessageView | None:
        focused = self.focused
        if isinstance(focused, MessageView) and focused.role == role and focused.message_id is not None:
            return focused
        views = [v for v in self._views() if v.role == role and v.message_id is not None]
        return views[-1] if views else None

    async def action_regenerate(self) -> None:
        if self.generating or self.backend is None:
            return
        messages = self.store.messages(self.chat_id)
        if not messages:
            self.notify("Nothing to regenerate yet.")
            return
        if messages[-1].role == "assistant":
            self.store.delete_from(self.chat_id, messages[-1].id)
            for v in self._views():
                if v.message_id == messages[-1].id:
                    await v.remove()
        await self.start_reply()

    async def action_edit_last(self) -> None:
        if self.generating:
            return
        view = self._target_view("user")
        if view is None:
            self.notify("No message to edit.")
            return
        self.store.delete_from(self.chat_id, view.message_id)
        for v in self._views():
            if v.message_id is not None and v.message_id >= view.message_id:
                await v.remove()
        prompt = self.query_one("#prompt", PromptInput)
        prompt.text = view.content
        prompt.focus()
        self.notify("Edit the message and press Enter to resend it.")

    # ------------------------------------------------------------------ copy

    async def action_mark_wrong(self) -> None:
        view = self._target_view("assistant")
        entry = view.meta.get("cache_entry") if view else None
        if not entry:
            self.notify("That reply did not come from the cache.", severity="warning")
            return
        mark = getattr(self.backend, "mark_wrong", None)
        evicted = bool(mark and await asyncio.to_thread(mark, entry))
        view.meta["cache_entry"] = None
        if view.message_id is not None:
            self.store.update_meta(view.message_id, view.meta)
        self.notify("Cached answer evicted and counted as a false hit." if evicted
                    else "That cache entry was already gone.")

    def action_copy_message(self) -> None:
        view = self._target_view("assistant")
        if view is None:
            self.notify("No reply to copy.")
            return
        self.copy_to_clipboard(view.content)
        self.notify("Reply copied to the clipboard.")

    def action_copy_code(self) -> None:
        view = self._target_view("assistant")
        blocks = code_blocks(view.content) if view else []
        if not blocks:
            self.notify("That reply has no code block.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify("Code block copied to the clipboard.")

    # ------------------------------------------------------------------ views

    def action_toggle_origins(self) -> None:
        self.show_origins = not self.show_origins
        for v in self._views():
            v.set_show_origins(self.show_origins)
        if self.show_origins:
            self.notify("Accepted-token view: green = drafted and accepted, grey = produced by the target.")

    def action_toggle_metrics(self) -> None:
        self.query_one("#metrics").toggle_class("-visible")
        self.refresh_metrics()

    def action_toggle_sidebar(self) -> None:
        self.query_one("#sidebar").toggle_class("-hidden")

    def refresh_metrics(self) -> None:
        pane = self.query_one("#metrics", MetricsPane)
        info = self.backend.info if self.backend else None
        pane.show(self.metrics.snapshot(), info, self.memory_probe())

    def action_models(self) -> None:
        if not isinstance(self.screen, ModelsScreen):
            self.push_screen(ModelsScreen(self.model_rows, self.active_profile))

    def action_help(self) -> None:
        keys = [("enter", "Send the message"), (" / ".join(NEWLINE_KEYS), "New line in the message")]
        keys += [(k, d) for k, _, _, d, _ in KEYS]
        keys += [("ctrl+p", "Command palette (every action, themes)"), ("ctrl+q", "Quit")]
        self.push_screen(HelpScreen(keys))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in {a for _, a, _, _, _ in KEYS} - _GLOBAL_ACTIONS and self.screen is not self.default_screen:
            return False  # chat actions wait until the chat screen is in front
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for _, action, _, description, _ in KEYS:
            yield SystemCommand(description, f"localspec: {description.lower()}", _runner(self, action))

    # ------------------------------------------------------------------ shutdown

    async def on_unmount(self) -> None:
        if self.generation is not None:
            self.generation.cancel()
        partial, self._partial = self._partial, None  # no writes after the store closes
        if partial is not None:  # closing mid-reply: keep all that streamed, still marked interrupted
            partial.flush()
        self.workers.cancel_all()
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        self.store.close()
        self.metrics.close()


def _runner(app: ChatApp, action: str) -> Callable[[], object]:
    async def run() -> None:
        await app.run_action(action)

    return run


def _process_rss() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None
