"""Replies: send a message, stream the answer, cancel, regenerate, edit and resend.

The reply streams on a worker thread that never touches a widget: it appends tokens to the reply's
`TokenBuffer` and posts one typed message when the reply ends (`streaming.py`). On the UI thread a
timer drains the buffer at most FRAMES_PER_S times a second, and less often when a frame costs more
than UI_CPU_SHARE of a core (`FramePacer`), so the Markdown writes and the cross-thread traffic of
a reply are bounded by its frames, not its tokens: the view would otherwise spend the cores that
llama.cpp's threads need on one re-render and one thread hop per token.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from textual.containers import VerticalScroll

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Stats, Token
from localspec.engine.sampling import SamplingParams
from localspec.engine.thoughts import answer_only
from localspec.errors import LocalspecError
from localspec.tui.backend import Backend, ServerLost
from localspec.tui.base import ScreenPart
from localspec.tui.dialogs import ErrorDialog
from localspec.tui.safe_text import terminal_safe
from localspec.tui.store import ROLES, ChatStoreBusy, PartialReply, interrupted_meta
from localspec.tui.streaming import FRAMES_PER_S, ContextTrimmed, Reply, ReplyEnded, ReplyRefused, ServerGone
from localspec.tui.widgets import MessageView, PromptInput, add_segment, opened_thought, predicted_reply

if TYPE_CHECKING:
    from localspec.tui.chat_screen import ChatScreen

logger = logging.getLogger(__name__)

class Replies(ScreenPart):
    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        self.generating = False  # from send until the reply ends (queued replies included)
        self.current: Reply | None = None  # the reply streaming now
        self.queued: MessageView | None = None  # a reply waiting for the models to load

    async def send(self, text: str) -> None:
        text = text.strip()
        if not text:
            return
        if self.generating:
            self.app.notify("Your last message is still waiting for the models (Esc cancels it)." if self.queued
                            else "A reply is still running (Esc cancels it).", severity="warning")
            return
        loader = self.screen.loader
        if loader.backend is None and not loader.loading:
            self.app.notify("No models loaded: Ctrl+L opens the models screen.", severity="warning")
            return
        chats = self.screen.chats
        try:
            chat = chats.chat
            message = self.store.add_message(chat.id, "user", text)
        except ChatStoreBusy as exc:  # another program holds chats.sqlite: the text stays in the prompt
            self.app.notify(str(exc), title="Not sent", severity="error", timeout=15)
            return
        if chat.title == "New chat":
            await chats.rename(chat.id, text.splitlines()[0][:40])
        self.screen.query_one("#prompt", PromptInput).clear()
        await self.screen.query_one("#messages").mount(MessageView("user", text, {}, message.id))
        await self.start()

    def _request(self) -> GenerationRequest:
        chat = self.screen.chats.chat
        p = chat.params
        messages = [{"role": "system", "content": chat.system_prompt}] if chat.system_prompt else []
        # An empty reply (interrupted before its first token) says nothing to the model; a role this version
        # does not write (a hand edit, a newer version) is shown but not sent: the engine refused the chat.
        # A reply's thought is not sent back (as thinking models' templates drop it): its answer is.
        turns = [(m.role, answer_only(m.content, opened=opened_thought(m.meta)) if m.role == "assistant"
                  else m.content) for m in self.store.messages(chat.id) if m.role in ROLES]
        messages += [{"role": role, "content": text} for role, text in turns if text or role != "assistant"]
        # Predicted Outputs: the code the user pasted into the message being answered (not earlier turns).
        last = messages[-1] if messages and messages[-1]["role"] == "user" else None
        prediction = predicted_reply(last["content"]) if last is not None and p.predict_code else None
        return GenerationRequest(  # pydantic validates the dicts and the mode string
            messages=messages, max_tokens=p.max_tokens, sampling=SamplingParams(temperature=p.temperature),
            mode=p.mode, k=p.draft_k, truncate=True, prediction=prediction,
            template_vars=None if p.think is None else {"enable_thinking": p.think},
        )

    async def start(self, view: MessageView | None = None) -> None:
        """Answer the chat's last message now, or once the models are loaded (`view`: the waiting reply)."""
        self.queued = None
        loader, chat = self.screen.loader, self.screen.chats.chat
        backend = loader.backend
        wanted = chat.params.profile or self.app.active_profile
        if (backend is not None and backend.info.kind == "in-process" and wanted
                and wanted != (backend.info.profile or _default_profile())):
            if _known_profile(wanted):
                self.app.notify(f"Loading profile '{wanted}' for this chat…")
                loader.load(wanted)
                backend = None
            else:  # loading it would unload the models that can answer, and then fail
                self.app.notify(f"This chat's profile '{wanted}' is not in models.toml any more; the loaded models "
                                "answer. Fix: choose a profile in the chat settings (Ctrl+S).", severity="warning")
        self.generating = True  # set before any await: the reply is under way from here on
        if view is None:
            view = MessageView("assistant", "", None, None, self.screen.tools.show_origins)
            await self.screen.query_one("#messages").mount(view)
            self.screen.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        if backend is None:  # the models are loading: the reply waits for them
            self.queued = view
            view.set_waiting(True)
            self.screen.show_loading()
            return
        view.set_waiting(False)
        try:
            request = self._request()
        except ValueError as exc:  # pydantic: parameters out of range
            self.generating = False
            await view.remove()
            self.app.push_screen(ErrorDialog(f"Invalid chat parameters: {exc}.", "Fix them in chat settings (Ctrl+S)."))
            return
        view.opens_thought = backend.opens_thought(request)
        # The reply has a row from its start, marked interrupted until it finishes: a killed app
        # reopens with what had streamed so far, marked, instead of a question without an answer.
        view.message_id = self.store.add_message(chat.id, "assistant", "", interrupted_meta([])).id
        reply = self.current = Reply(view, chat.id, PartialReply(self.store, view.message_id))
        reply.frames = self.screen.set_interval(1 / FRAMES_PER_S, lambda: self._frame(reply))
        self.screen.run_worker(lambda: self._stream(backend, request, chat.params.route, reply), thread=True,
                               group="generate", exclusive=False)

    def _stream(self, backend: Backend, request: GenerationRequest, route: str | None, reply: Reply) -> None:
        """The worker thread: tokens into the buffer, the outcome back as one message."""
        try:
            generation = backend.start(request, route=route)
        except ServerLost as exc:
            self.post(ServerGone(reply, exc))
            return
        except LocalspecError as exc:
            self.post(ReplyRefused(reply, exc))
            return
        except Exception as exc:
            logger.exception("starting a reply failed")
            self.post(ReplyRefused(reply, LocalspecError(f"The request failed: {exc}.")))
            return
        reply.attach(generation)
        if generation.dropped_messages:
            self.post(ContextTrimmed(generation.dropped_messages))
        try:
            for event in generation:
                if isinstance(event, Token):
                    reply.buffer.push(event)
                elif isinstance(event, Done):
                    self.post(ReplyEnded(reply, event, generation))
        except Exception as exc:  # a backend that breaks mid-stream ends this reply only
            logger.exception("reply stream failed")
            # No text: the view's own (every token drained) is what streamed.
            self.post(ReplyEnded(reply, Done("error", Stats(), "", str(exc)), generation))

    async def _frame(self, reply: Reply) -> None:
        if reply.pacer.due():
            await self._show(reply)

    async def _show(self, reply: Reply) -> None:
        """One frame: whatever the buffer holds, in one write."""
        tokens = reply.buffer.drain()
        if not tokens:
            return
        await reply.view.add_tokens(tokens)
        if reply is self.current:  # the partial row stops being written once the reply ended
            reply.partial.grew(reply.view.content, reply.view.segments)

    def _stop(self, reply: Reply) -> None:
        if reply.frames is not None:
            reply.frames.stop()
        if self.current is reply:
            self.current = None
        self.generating = False

    def _forget_row(self, view: MessageView) -> None:
        if view.message_id is not None:
            self.store.delete_message(view.message_id)
            view.message_id = None

    async def refused(self, message: ReplyRefused) -> None:
        reply = message.reply
        self._stop(reply)
        self._forget_row(reply.view)
        await reply.view.remove()
        self.app.push_screen(ErrorDialog(message.error.cause, message.error.fix))

    def server_gone(self, message: ServerGone) -> None:
        """Nothing was sent: the reply waits, as a message sent while loading does, for the backend
        the app builds again (another server, or the models in this process)."""
        reply = message.reply
        self._stop(reply)
        self._forget_row(reply.view)
        self.generating = True
        self.queued = reply.view
        reply.view.set_waiting(True)
        self.app.notify(f"{message.error.cause}: your message was not sent there. Loading the models here "
                        "(or attaching to a server that took its place); it is sent when they are ready.",
                        title="Server gone", severity="warning", timeout=10)
        self.screen.loader.load(self.app.active_profile)

    async def ended(self, message: ReplyEnded) -> None:
        reply, done, generation = message.reply, message.done, message.generation
        if reply.frames is not None:
            reply.frames.stop()
        await self._show(reply)  # the last tokens, always, before the final render
        view = reply.view
        await view.finish(done, generation.cached, generation.route, generation.cache_entry)
        self._stop(reply)
        self.screen.record_reply(done, generation, e2e_ms=(time.perf_counter() - reply.started) * 1000)
        if done.text or done.finish_reason != "cancelled":
            assert view.message_id is not None
            try:
                self.store.update_message(view.message_id, view.content, view.meta)
                self.store.touch(reply.chat_id)
            except ChatStoreBusy as exc:  # the reply stays on screen; its row keeps the last partial save
                self.app.notify(str(exc), title="Reply not saved", severity="error", timeout=15)
        else:
            self._forget_row(view)
            await view.remove()
        if done.finish_reason == "error":
            self.app.notify(f"Generation failed: {done.error}", title="Error", severity="error", timeout=10)
        elif done.finish_reason == "cancelled":
            self.app.notify("Reply cancelled.")

    # ------------------------------------------------------------------ the queue while loading

    async def start_queued(self) -> None:
        if self.queued is not None:  # still waiting (Esc may have cancelled it meanwhile)
            await self.start(self.queued)

    def drop_queued(self) -> None:
        """Loading failed: the waiting message stays in the chat, unanswered, and the app is free again."""
        view, self.queued = self.queued, None
        if view is not None:
            self.generating = False
            view.remove()
            self.app.notify("Your message was not sent: the models did not load. It stays in the chat; "
                            "Ctrl+R answers it once they are loaded.", severity="warning", timeout=10)

    async def cancel(self) -> None:
        if self.queued is not None:
            view, self.queued = self.queued, None
            self.generating = False
            await view.remove()
            self.screen.show_loading()
            self.app.notify("Not sent: your message stays in the chat; Ctrl+R answers it once the models are loaded.")
        elif self.current is not None:
            self.current.cancel()

    # ------------------------------------------------------------------ regenerate, edit

    async def regenerate(self) -> None:
        if self.generating or self.screen.loader.backend is None:
            return
        chat_id = self.screen.chats.chat.id
        messages = self.store.messages(chat_id)
        if not messages:
            self.app.notify("Nothing to regenerate yet.")
            return
        if messages[-1].role == "assistant":
            self.store.delete_from(chat_id, messages[-1].id)
            for v in self.screen.message_views():
                if v.message_id == messages[-1].id:
                    await v.remove()
        await self.start()

    async def edit_last(self) -> None:
        if self.generating:
            return
        view = self.screen.target_view("user")
        if view is None or view.message_id is None:
            self.app.notify("No message to edit.")
            return
        self.store.delete_from(self.screen.chats.chat.id, view.message_id)
        for v in self.screen.message_views():
            if v.message_id is not None and v.message_id >= view.message_id:
                await v.remove()
        prompt = self.screen.query_one("#prompt", PromptInput)
        prompt.text = terminal_safe(view.content)  # a TextArea would draw a stored escape as written
        prompt.focus()
        self.app.notify("Edit the message and press Enter to resend it.")

    def close(self) -> None:
        """The app is closing: stop the reply and keep all that streamed, still marked interrupted."""
        reply, self.current = self.current, None  # no writes after the store closes
        if reply is None:
            return
        reply.cancel()
        if reply.frames is not None:
            reply.frames.stop()
        view = reply.view
        tokens = reply.buffer.drain()  # not rendered any more, but saved
        content = view.content + "".join(t.text for t in tokens)
        segments = [list(s) for s in view.segments]
        for t in tokens:
            add_segment(segments, t.text, t.origin)
        reply.partial.grew(content, segments)
        reply.partial.flush()


def _known_profile(name: str) -> bool:
    """Whether the registry (models.toml included) has this profile; an unreadable one says nothing
    against it, and the load says what is wrong."""
    try:
        from localspec.models import ModelManager

        return name in ModelManager().registry.profiles
    except LocalspecError:
        return True


def _default_profile() -> str | None:
    try:
        from localspec.models import ModelManager

        return ModelManager().registry.default_profile
    except LocalspecError:
        return None
