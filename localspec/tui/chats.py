"""The chat list: which chat is open, and creating, opening, renaming, deleting, exporting chats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.containers import VerticalScroll
from textual.widgets import Button, Label, ListItem, ListView

from localspec.errors import LocalspecError
from localspec.tui.base import ScreenPart
from localspec.tui.dialogs import ChatSettingsDialog, ConfirmDialog, TextPrompt
from localspec.tui.safe_text import terminal_safe
from localspec.tui.store import Chat, ChatParams, ChatStoreBusy, Message, export_chat
from localspec.tui.widgets import MessageView

if TYPE_CHECKING:
    from localspec.tui.chat_screen import ChatScreen

_BUSY = "Wait for the reply to finish, or press Esc to cancel it."
# A chat opens with its last PAGE messages; older ones come a page at a time, on request. Every
# message is a dozen widgets or more, laid out again on every frame of a reply: a chat of 500
# messages took most of a minute to open and seconds a frame to stream into.
PAGE = 40


class Chats(ScreenPart):
    chat_id: int | None = None

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self.earlier: list[Message] = []  # the open chat's messages not shown yet, oldest first

    @property
    def chat(self) -> Chat:
        assert self.chat_id is not None, "a chat is open from mount on"
        return self.store.get_chat(self.chat_id)

    def _set_title(self, title: str) -> None:
        self.app.title = f"localspec — {terminal_safe(title)}"

    async def open_first(self) -> None:
        """On mount: the chat used last, else the newest, else a new one."""
        chats = self.store.list_chats()
        last = self._last_chat_id()
        if last in {c.id for c in chats}:
            chat_id = last
        elif chats:
            chat_id = chats[0].id
        else:
            chat_id = self.store.create_chat(params=self.app.new_chat_params).id
        self.chat_id = chat_id
        await self.refresh_list()
        await self.open(chat_id)

    def _last_chat_id(self) -> int | None:
        last = self.store.get_pref("last_chat")
        if not last:
            return None
        try:
            return int(last)
        except ValueError:  # a hand edit; opening a chat saves a good one again
            self.app.notify(f"The last open chat saved in {self.store.path.name} is not a chat id ('{last[:40]}'); "
                            "opened the newest chat. Fix: none needed, it is saved again now.", severity="warning")
            return None

    def tell_repairs(self) -> None:
        """Say what the store repaired on reading (a bad row shows what it can, and says so once)."""
        for line in self.store.take_notices():
            self.app.notify(line, title=f"Damaged data in {self.store.path.name}", severity="warning", timeout=15)

    async def refresh_list(self) -> None:
        view = self.screen.query_one("#chat-list", ListView)
        await view.clear()
        chats = self.store.list_chats()
        await view.extend(ListItem(Label(terminal_safe(c.title), markup=False), id=f"chat-{c.id}") for c in chats)
        for i, c in enumerate(chats):
            if c.id == self.chat_id:
                view.index = i
        self.tell_repairs()

    def _locked(self, exc: ChatStoreBusy) -> None:
        """Another program holds chats.sqlite: the action did nothing, and says so (the app goes on)."""
        self.app.notify(str(exc), title="Chat database busy", severity="error", timeout=15)

    async def open(self, chat_id: int) -> None:
        try:
            messages = self.store.messages(chat_id)
            self.store.set_pref("last_chat", str(chat_id))
        except ChatStoreBusy as exc:  # the chat shown stays
            self._locked(exc)
            return
        self.chat_id = chat_id
        box = self.screen.query_one("#messages", VerticalScroll)
        await box.remove_children()
        self.earlier, shown = messages[:-PAGE], messages[-PAGE:]
        if self.earlier:
            await box.mount(Button(self._earlier_label(), id="earlier", compact=True))
        if shown:
            await box.mount_all(self._views(shown))
        self._set_title(self.chat.title)
        self.tell_repairs()
        box.scroll_end(animate=False)
        view = self.screen.query_one("#chat-list", ListView)
        for i, item in enumerate(view.children):
            if item.id == f"chat-{chat_id}":
                view.index = i

    async def show_earlier(self) -> None:
        """The page of messages before those shown, above them."""
        page, self.earlier = self.earlier[-PAGE:], self.earlier[:-PAGE]
        button = self.screen.query_one("#earlier", Button)
        await self.screen.query_one("#messages", VerticalScroll).mount_all(self._views(page), after=button)
        if self.earlier:
            button.label = self._earlier_label()
        else:
            await button.remove()

    def _views(self, messages: list[Message]) -> list[MessageView]:
        show = self.screen.tools.show_origins
        return [MessageView(m.role, m.content, m.meta, m.id, show) for m in messages]

    def _earlier_label(self) -> str:
        return f"Show {min(PAGE, len(self.earlier))} earlier messages ({len(self.earlier)} not shown)"

    async def rename(self, chat_id: int, title: str) -> None:
        try:
            self.store.rename_chat(chat_id, title)
        except ChatStoreBusy as exc:
            self._locked(exc)
            return
        self._set_title(title)
        await self.refresh_list()

    async def selected(self, item: ListItem) -> None:
        chat_id = int((item.id or "chat-0").removeprefix("chat-"))
        if chat_id == self.chat_id:
            return
        if self.screen.replies.generating:
            self.app.notify(_BUSY, severity="warning")
            return
        await self.open(chat_id)
        self.screen.focus_prompt()

    async def new(self) -> None:
        if self.screen.replies.generating:
            self.app.notify(_BUSY, severity="warning")
            return
        try:
            self.chat_id = self.store.create_chat(params=self.app.new_chat_params).id
        except ChatStoreBusy as exc:
            self._locked(exc)
            return
        await self.refresh_list()
        await self.open(self.chat_id)
        self.screen.focus_prompt()

    def ask_rename(self) -> None:
        try:
            chat = self.chat
        except ChatStoreBusy as exc:
            self._locked(exc)
            return

        async def renamed(title: str | None) -> None:
            if title:
                await self.rename(chat.id, title)

        self.app.push_screen(TextPrompt("Rename chat", terminal_safe(chat.title)), renamed)

    def ask_delete(self) -> None:
        if self.screen.replies.generating:
            self.app.notify("Cancel the running reply first (Esc).", severity="warning")
            return
        try:
            chat = self.chat
        except ChatStoreBusy as exc:
            self._locked(exc)
            return

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.store.delete_chat(chat.id)
                rest = self.store.list_chats()
                self.chat_id = rest[0].id if rest else self.store.create_chat(params=self.app.new_chat_params).id
            except ChatStoreBusy as exc:
                self._locked(exc)
                return
            await self.refresh_list()
            await self.open(self.chat_id)
            self.app.notify(f"Deleted '{chat.title}'.")

        self.app.push_screen(ConfirmDialog(f"Delete the chat '{chat.title}' and its messages?", yes="Delete"),
                             confirmed)

    def export(self) -> None:
        try:
            chat = self.chat
        except ChatStoreBusy as exc:
            self._locked(exc)
            return
        try:
            path = export_chat(chat, self.store.messages(chat.id), self.app.export_dir)
        except OSError as exc:
            self.app.notify(f"Export failed: {exc}", severity="error")
            return
        self.app.notify(f"Exported to {path}", title="Export")

    def edit_settings(self) -> None:
        try:
            chat = self.chat
        except ChatStoreBusy as exc:
            self._locked(exc)
            return
        try:
            from localspec.models import ModelManager

            profiles = list(ModelManager().registry.profiles)
        except LocalspecError as exc:  # the dialog still opens: the prompt and parameters do not need them
            self.app.notify(f"The profile list could not be read: {exc}", title="Profiles", severity="warning")
            profiles = []

        def saved(result: tuple[str, ChatParams] | None) -> None:
            if result:
                system_prompt, params = result
                try:
                    self.store.update_settings(chat.id, system_prompt, params)
                except ChatStoreBusy as exc:
                    self._locked(exc)
                    return
                self.app.notify("Chat settings saved.")

        self.app.push_screen(ChatSettingsDialog(chat.system_prompt, chat.params, profiles), saved)
