"""What the user does with a finished reply: copy it or its code, mark a cached one wrong, and the
accepted-token view (draft, prediction, target) across all replies."""

from __future__ import annotations

import asyncio

from localspec.tui.base import ScreenPart
from localspec.tui.store import encodable
from localspec.tui.widgets import ORIGIN_LEGEND, code_blocks


class ReplyTools(ScreenPart):
    show_origins = False

    def copy_message(self) -> None:
        view = self.screen.target_view("assistant")
        if view is None:
            self.app.notify("No reply to copy.")
            return
        self.app.copy_to_clipboard(encodable(view.answer))  # the terminal is sent UTF-8; a thought is not copied
        self.app.notify("Reply copied to the clipboard.")

    def copy_code(self) -> None:
        view = self.screen.target_view("assistant")
        blocks = code_blocks(view.answer) if view else []
        if not blocks:
            self.app.notify("That reply has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(encodable(blocks[-1]))
        self.app.notify("Code block copied to the clipboard.")

    async def mark_wrong(self) -> None:
        view = self.screen.target_view("assistant")
        entry = view.meta.get("cache_entry") if view else None
        if view is None or not entry:
            self.app.notify("That reply did not come from the cache.", severity="warning")
            return
        backend = self.screen.loader.backend
        evicted = backend is not None and await asyncio.to_thread(backend.mark_wrong, entry)
        view.meta["cache_entry"] = None
        if view.message_id is not None:
            self.store.update_meta(view.message_id, view.meta)
        self.app.notify("Cached answer evicted and counted as a false hit." if evicted
                        else "That cache entry was already gone.")

    def toggle_origins(self) -> None:
        self.show_origins = not self.show_origins
        for v in self.screen.message_views():
            v.set_show_origins(self.show_origins)
        if self.show_origins:
            self.app.notify(ORIGIN_LEGEND)
