"""Loading the backend: a thread builds it, typed messages bring the outcome back to the screen.

`load` numbers each load, so a message from a load the app has since replaced (a profile switch)
is ignored, and a backend that arrives after that is closed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message as TextualMessage

from localspec.engine.events import LoadProgress, LoadStage
from localspec.errors import LocalspecError, ModelNotFoundError
from localspec.tui.backend import Backend, BackendFactory
from localspec.tui.base import ScreenPart
from localspec.tui.dialogs import ConfirmDialog, ErrorDialog
from localspec.tui.models_screen import ModelsScreen

if TYPE_CHECKING:
    from localspec.tui.chat_screen import ChatScreen

logger = logging.getLogger(__name__)


class LoadProgressed(TextualMessage):
    """Posted from the loading thread (post_message is thread-safe) for each progress report."""

    def __init__(self, progress: LoadProgress, load: int) -> None:
        super().__init__()
        self.progress = progress
        self.load = load


class BackendReady(TextualMessage):
    def __init__(self, backend: Backend, load: int) -> None:
        super().__init__()
        self.backend = backend
        self.load = load


class LoadFailed(TextualMessage):
    def __init__(self, error: LocalspecError, load: int) -> None:
        super().__init__()
        self.error = error
        self.load = load


class ModelsMissing(TextualMessage):
    def __init__(self, profile: str | None, error: ModelNotFoundError, load: int) -> None:
        super().__init__()
        self.profile = profile
        self.error = error
        self.load = load


def loading_status(profile: str | None, progress: LoadProgress | None, queued: bool) -> str:
    """e.g. "Loading models (default profile)… qwen2.5-coder-1.5b 45% · 1.2 s · your message is queued"."""
    text = f"Loading models ({profile or 'default profile'})…"
    if progress is not None:
        what = ("calibrating speculative costs (one-time)" if progress.stage is LoadStage.CALIBRATE
                else f"{progress.model}")
        text += f" {what} {progress.fraction:.0%} · {progress.elapsed_s:.1f} s"
    if queued:
        text += " · your message is queued and is sent when they are ready (Esc cancels it)"
    return text


def calibrated_notice(progress: LoadProgress) -> str:
    return (f"Calibrated speculative costs in {progress.elapsed_s:.1f} s "
            "(once per model, llama.cpp build and thread count).")


@dataclass
class _Load:
    number: int
    profile: str | None
    progress: LoadProgress | None = None


class Loader(ScreenPart):
    """Owns the backend: loads it for a profile on a thread, swaps it in when it is ready."""

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self.backend: Backend | None = None
        self.loading = False
        self._current = _Load(0, None)

    def load(self, profile: str | None) -> None:
        self.loading = True
        self._current = _Load(self._current.number + 1, profile)
        old, self.backend = self.backend, None  # the old one closes on the loading thread
        self.screen.show_loading()
        factory, number = self.app.backend_factory, self._current.number
        self.screen.run_worker(lambda: self._build(factory, profile, number, old), thread=True,
                               group="load", exclusive=True)

    def status(self, *, queued: bool) -> str:
        return loading_status(self._current.profile, self._current.progress, queued)

    def _build(self, factory: BackendFactory, profile: str | None, load: int, old: Backend | None) -> None:
        """The loading thread: everything it learns goes back as a message."""
        def on_progress(progress: LoadProgress) -> None:  # inside llama.cpp's load
            self.post(LoadProgressed(progress, load))

        try:
            if old is not None:
                old.close()
            backend = factory(profile, on_progress=on_progress)
        except ModelNotFoundError as exc:
            self.post(ModelsMissing(profile, exc, load))
            return
        except LocalspecError as exc:
            self.post(LoadFailed(exc, load))
            return
        except Exception as exc:  # a broken model file or build: say so, keep the app alive
            logger.exception("loading the backend failed")
            self.post(LoadFailed(LocalspecError(f"Loading the models failed: {exc}."), load))
            return
        if not self.post(BackendReady(backend, load)):
            backend.close()  # the app closed while the models loaded

    def _is_current(self, load: int) -> bool:
        return load == self._current.number and self.loading

    # ------------------------------------------------------------------ on the UI thread

    def progressed(self, message: LoadProgressed) -> None:
        if not self._is_current(message.load):
            return
        self._current.progress = message.progress
        self.screen.show_loading()
        if message.progress.stage is LoadStage.CALIBRATE and message.progress.finished:
            self.app.notify(calibrated_notice(message.progress), title="One-time set-up", timeout=8)

    def ready(self, message: BackendReady) -> bool:
        """Swap the backend in; False (and closed) when a later load replaced this one."""
        if not self._is_current(message.load):
            message.backend.close()
            return False
        self.backend = backend = message.backend
        self.loading = False
        info = backend.info
        where = f"{info.kind} · {info.accelerator}"
        self.screen.set_status(f"{info.target}" + (f" + draft {info.draft}" if info.draft else "") + f" · {where}")
        self.app.sub_title = info.target
        return True

    async def failed(self, message: LoadFailed) -> bool:
        if not self._is_current(message.load):
            return False
        self.loading = False
        self.screen.set_status(f"Not loaded: {message.error.cause}")
        await self.app.push_screen(ErrorDialog(message.error.cause, message.error.fix))
        return True

    async def missing(self, message: ModelsMissing) -> bool:
        if not self._is_current(message.load):
            return False
        self.loading = False
        self.screen.set_status("No models installed for this profile. Ctrl+L opens the models screen.")
        profile, app = message.profile, self.app

        def answer(yes: bool | None) -> None:
            if yes:
                app.push_screen(ModelsScreen(app.model_rows, app.active_profile, pull_profile=profile or ""))

        # Awaited: the dialog is composed before anything else (a test, a key) reads it.
        await app.push_screen(ConfirmDialog(f"{message.error.cause}\n\nPull the models of the '{profile or 'default'}' "
                                            "profile now?", yes="Pull", no="Later"), answer)
        return True
