"""The chat screen's parts: messages, the prompt input and the metrics pane."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message as TextualMessage
from textual.widgets import Collapsible, Label, Markdown, Sparkline, Static, TextArea

from localspec.engine.events import Done, Stats, Token
from localspec.engine.thoughts import split_reasoning
from localspec.tui.backend import BackendInfo
from localspec.tui.safe_text import terminal_safe
from localspec.tui.session_metrics import SessionSnapshot
from localspec.tui.store import ROLES, reply_summary, stats_from_dict

# Accepted-token view: tokens a drafter proposed and the target accepted (green), tokens of the
# prediction the target accepted (blue), the target's own (grey). Other origins show unstyled.
ORIGIN_STYLES = {"draft": "bold #0b2e13 on #7fd88f", "prediction": "bold #0a1f3d on #7fb2f0",
                 "target": "#e0e0e0 on #2a2f3a"}
ORIGIN_LEGEND = ("Accepted-token view: green = drafted and accepted, blue = from the prediction (your code) "
                 "and accepted, grey = produced by the target.")
NEWLINE_KEYS = ("ctrl+j", "shift+enter")
# Textual's Markdown makes a widget of every block (paragraph, list item, table cell), and layout
# and render cost grows with them all: a reply of 5,000 one-line paragraphs or a 200x200 table took
# minutes to draw. Past this many blocks a message is shown as plain text (one widget) instead.
MAX_MARKDOWN_BLOCKS = 500
MAX_MARKDOWN_WIDGETS = 2 * MAX_MARKDOWN_BLOCKS  # the same bound, counted on a streaming reply's widgets
PLAIN_NOTE = "Shown as plain text: more Markdown blocks than the view draws well (F9 copies the reply)."
_CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
# A fence line as CommonMark has it: up to 3 spaces, then 3 or more backticks or tildes, then the info string.
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def code_blocks(markdown: str) -> list[str]:
    """Fenced code blocks, in order; an unclosed last block (a cut-off reply) counts too."""
    blocks = [b.rstrip("\n") for b in _CODE_BLOCK.findall(markdown)]
    if markdown.count("```") % 2 == 1:
        tail = markdown[markdown.rfind("```") :].split("\n", 1)
        if len(tail) == 2:
            blocks.append(tail[1].rstrip("\n"))
    return blocks


def predicted_reply(message: str) -> str | None:
    """The prediction for a reply to `message` (Predicted Outputs): its fenced code blocks, or None.

    The flow this serves is "paste code, ask for an edit": the answer then mostly repeats the code,
    each block fenced the way a model writes one ("```python", the code, "```"). So the prediction is
    every block of the message, in order, fences included (info string trimmed; an unclosed last block
    runs to the end and is closed), joined by a blank line: prose the reply adds around them is not
    predicted, and the engine realigns on the next block after it. Blocks without code are skipped.
    A prediction the reply does not follow costs only its rejected drafts; the answer is unchanged.
    """
    lines = message.splitlines()
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.fullmatch(lines[i])
        i += 1
        if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):  # `x```y` is inline code, not a fence
            continue
        fence, info = m.group(1), m.group(2).strip()
        body: list[str] = []
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(lines[i])
            i += 1
        i += 1  # past the closing fence
        if any(line.strip() for line in body):
            blocks.append("\n".join([fence + info, *body, fence]))
    return "\n\n".join(blocks) or None


def _closes(line: str, fence: str) -> bool:
    """A closing fence: the opening's character, at least as many, nothing else on the line."""
    text = line.strip()
    return len(text) >= len(fence) and text == fence[0] * len(text) and len(line) - len(line.lstrip(" ")) <= 3


def markdown_blocks(text: str, most: int = MAX_MARKDOWN_BLOCKS) -> int:
    """How many blocks Markdown would make of `text`, counted exactly only when more than `most` are
    possible: every block starts a line or is a table cell, and parsing costs as much as drawing."""
    if text.count("\n") + text.count("|") < most:
        return 0
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("gfm-like").parse(text)  # Textual's own parser
    return sum(t.nesting == 1 or t.type in ("fence", "code_block", "hr", "html_block") for t in tokens)


def origin_text(segments: Sequence[Sequence[str]]) -> Text:
    """Text coloured by origin from (text, origin) runs."""
    out = Text()
    for text, origin in segments:
        out.append(terminal_safe(text), style=ORIGIN_STYLES.get(origin, ""))
    return out


def add_segment(segments: list[list[str]], text: str, origin: str) -> None:
    if not text:
        return
    if segments and segments[-1][1] == origin:
        segments[-1][0] += text
    else:
        segments.append([text, origin])


class PromptInput(TextArea):
    """Multi-line input that grows with its text. Enter sends; Ctrl+J (or Shift+Enter) adds a line."""

    class Submitted(TextualMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        # A TextArea draws its text as written: pasted escapes (a terminal's output, a web page's
        # hidden text) would act on the terminal. They go in as visible stand-ins instead.
        event.stop()
        event.prevent_default()
        if not self.read_only:
            self.move_cursor(self.replace(terminal_safe(event.text), *self.selection).end_location)


ROLE_LABELS = {"user": "You", "assistant": "Assistant"}


OPENS_THOUGHT = "opens_thought"  # a reply's meta: its prompt opened the thought


def opened_thought(meta: dict | None) -> bool:
    """Whether a stored reply's prompt opened its thought (only a stored `true` says so)."""
    return meta is not None and meta.get(OPENS_THOUGHT) is True


class MessageView(Vertical, can_focus=True):
    """One message. An assistant reply streams in as Markdown and keeps its token origins."""

    def __init__(self, role: str, content: str = "", meta: dict | None = None, message_id: int | None = None,
                 show_origins: bool = False, *, opens_thought: bool | None = None) -> None:
        # A stored role is untrusted: as a class name, '[/]x' or 'two words' would stop the app.
        super().__init__(classes=f"message {role if role in ROLES else 'other-role'}")
        self.role = role
        self.content = content  # as the model wrote it: a thinking model's thought included
        # The prompt opened the thought (the answer holds only its `</think>`): the backend says so for a
        # new reply, the stored meta for an old one. Never guessed from the text: an answer may quote `</think>`.
        self.opens_thought: bool | None = opens_thought if opens_thought is not None else opened_thought(meta)
        self.shown = ""  # the answer as the body has drawn it, which a streaming reply appends to
        self.meta = dict(meta or {})
        self.message_id = message_id
        self.segments: list[list[str]] = [list(s) for s in self.meta.get("segments", [])]
        self.show_origins = show_origins
        self.finished = role != "assistant" or bool(self.meta)
        self.waiting = False  # queued until the models are loaded
        if self.interrupted:
            self.add_class("interrupted")

    @property
    def interrupted(self) -> bool:
        """A stored reply the app never finished (it was closed or killed while the reply streamed)."""
        return bool(self.meta.get("interrupted"))

    def split(self) -> tuple[str | None, str]:
        """(the thought, the answer) of a reply (engine/thoughts.py); a user's text is all answer."""
        if self.role != "assistant":
            return None, self.content
        return split_reasoning(self.content, opened=bool(self.opens_thought))

    @property
    def answer(self) -> str:
        """What the reply says, without its thought: what is drawn as Markdown, copied and sent back."""
        return self.split()[1]

    def compose(self) -> ComposeResult:
        yield Label(terminal_safe(ROLE_LABELS.get(self.role, self.role)), classes="role", markup=False)
        thought, self.shown = self.split()
        if self.role == "assistant":  # a thinking model's thought, folded: the answer is what is read
            with Collapsible(title=self._thought_title(thought), collapsed=True, classes="thought"):
                yield Static(Text(terminal_safe(thought or "")), classes="thought-body")
        if markdown_blocks(self.shown) > MAX_MARKDOWN_BLOCKS:
            yield from self._plain_body()
        else:
            # A link's text is the model's and hides where it goes: the screen asks before opening it.
            yield Markdown(terminal_safe(self.shown), classes="body", open_links=False)
        if self.role == "assistant":
            yield Static(origin_text(self.segments), classes="origins")
            with Horizontal(classes="reply-footer"):
                yield Static(self._summary(), classes="stats", markup=False)
                yield Label("cached", classes="badge cached")
                yield Label(self._route_label(), classes="route", markup=False)

    def on_mount(self) -> None:
        self._apply_view()
        if self.role == "assistant":
            self.query_one(".cached").display = bool(self.meta.get("cached"))
            self.query_one(".thought", Collapsible).display = self.split()[0] is not None

    def _thought_title(self, thought: str | None) -> str:
        size = f"{len(thought or ''):,} characters"
        return f"Thinking… ({size})" if not self.finished and not self.shown else f"Thought ({size})"

    def _show_thought(self, thought: str | None) -> None:
        folded = self.query_one(".thought", Collapsible)
        folded.display = thought is not None
        if thought is None:
            return
        folded.title = self._thought_title(thought)
        # Folded while it streams, a long thought's text is drawn once, when it is opened or ends: a frame
        # spends nothing on what is not shown.
        if not folded.collapsed or self.finished:
            self.query_one(".thought-body", Static).update(Text(terminal_safe(thought)))

    def on_collapsible_expanded(self, event: Collapsible.Expanded) -> None:
        thought = self.split()[0]
        if thought is not None:
            self.query_one(".thought-body", Static).update(Text(terminal_safe(thought)))

    # ------------------------------------------------------------------ streaming

    async def add_tokens(self, tokens: Sequence[Token]) -> None:
        """One frame's tokens: one Markdown write and one origins update, however many there are."""
        fragment = ""
        for token in tokens:
            add_segment(self.segments, token.text, token.origin)
            fragment += token.text
        if not fragment:
            return
        self.content += fragment
        thought, answer = self.split()
        more, self.shown = answer[len(self.shown):] if answer.startswith(self.shown) else None, answer
        body = self._body()
        if isinstance(body, Static):
            body.update(Text(terminal_safe(answer)))
        elif more is None:  # the answer was read again: a `</think>` showed what came before it was thought
            await body.update(terminal_safe(answer))
        # Appended and awaited here, not through Markdown's stream: frames and the reply's end run one
        # at a time on the screen, so no append is still in flight (or cancelled half way, as a
        # stream's stop does) when `finish` replaces the document.
        elif len(body.query("*")) + markdown_blocks(more) > MAX_MARKDOWN_WIDGETS:
            await self._to_plain(body)
        elif more:
            await body.append(terminal_safe(more))
        self._show_thought(thought)
        if self.show_origins:
            self.query_one(".origins", Static).update(origin_text(self.segments))

    async def finish(self, done: Done, cached: bool | None, route: str | None, cache_entry: str | None = None) -> None:
        self.content = done.text or self.content
        thought, self.shown = self.split()
        body = self._body()
        if isinstance(body, Static):
            body.update(Text(terminal_safe(self.shown)))
        elif markdown_blocks(self.shown) > MAX_MARKDOWN_BLOCKS:
            await self._to_plain(body)
        else:
            await body.update(terminal_safe(self.shown))
        self.meta = {
            "stats": done.stats.to_dict(), "finish_reason": done.finish_reason, "segments": self.segments,
            "cached": cached, "route": route, "error": done.error, "cache_entry": cache_entry,
            **({OPENS_THOUGHT: True} if self.opens_thought else {}),
        }
        self.finished = True
        self._show_thought(thought)
        self.remove_class("interrupted")
        self.query_one(".stats", Static).update(self._summary())
        self.query_one(".cached").display = bool(cached)
        self.query_one(".route", Label).update(self._route_label())
        self.query_one(".origins", Static).update(origin_text(self.segments))

    def _body(self) -> Markdown | Static:
        """The message's text: Markdown, or plain text when it has too many blocks."""
        body = self.query_one(".body")
        assert isinstance(body, Markdown | Static)
        return body

    def _plain_body(self) -> list[Static]:
        return [Static(PLAIN_NOTE, classes="plain-note", markup=False),
                Static(Text(terminal_safe(self.shown)), classes="body plain")]

    async def _to_plain(self, markdown: Markdown) -> None:
        body = self._plain_body()
        body[-1].display = markdown.display
        await self.mount_all(body, before=markdown)
        await markdown.remove()

    def set_waiting(self, waiting: bool) -> None:
        self.waiting = waiting
        if self.is_mounted:
            self.query_one(".stats", Static).update(self._summary())

    # ------------------------------------------------------------------ views

    def set_show_origins(self, show: bool) -> None:
        self.show_origins = show
        if self.is_mounted:
            self._apply_view()

    def _apply_view(self) -> None:
        if self.role != "assistant":
            return
        origins = self.query_one(".origins", Static)
        origins.update(origin_text(self.segments))
        origins.display = self.show_origins
        self.query_one(".body").display = not self.show_origins

    def stats(self) -> Stats | None:
        raw = self.meta.get("stats")
        return stats_from_dict(raw) if raw else None

    def _summary(self) -> str:
        stats = self.stats()
        if stats is None and self.interrupted:
            return "interrupted: the app closed before this reply finished (Ctrl+R regenerates it)"
        if stats is None:
            return "queued: it is sent when the models are loaded" if self.waiting else "generating…"
        text = reply_summary(stats)
        reason = self.meta.get("finish_reason")
        if reason in ("cancelled", "error", "length"):
            text += f" · {reason}"
        return text

    def _route_label(self) -> str:
        route = self.meta.get("route")
        return f"route {route}" if route else "route –"


class MetricsPane(Vertical):
    """Live figures for this session; fed from the session metrics after every reply."""

    def compose(self) -> ComposeResult:
        yield Label("Metrics", classes="pane-title")
        yield Label("tokens/s", id="tps-label")
        yield Sparkline([0.0], id="tps-spark")
        yield Label("acceptance", id="acc-label")
        yield Sparkline([0.0], id="acc-spark")
        yield Static("", id="metrics-body")

    def show(self, snap: SessionSnapshot, info: BackendInfo | None, rss_bytes: int | None) -> None:
        tps, acc = snap.tokens_per_second, snap.acceptance
        self.query_one("#tps-spark", Sparkline).data = tps or [0.0]
        self.query_one("#acc-spark", Sparkline).data = acc or [0.0]
        self.query_one("#tps-label", Label).update(f"tokens/s  last {tps[-1]:.1f}" if tps else "tokens/s  –")
        self.query_one("#acc-label", Label).update(f"acceptance  last {acc[-1]:.0%}" if acc else "acceptance  –")
        self.query_one("#metrics-body", Static).update(metrics_text(snap, info, rss_bytes))


def _mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:,.0f} MB"


def metrics_text(snap: SessionSnapshot, info: BackendInfo | None, rss_bytes: int | None) -> Text:
    t = Text()

    def row(key: str, value: str) -> None:
        t.append(f"{key:<12}", style="dim")
        t.append(f"{value}\n")

    row("TTFT", "–" if snap.last_ttft_ms is None else f"{snap.last_ttft_ms:.0f} ms")
    t.append("\nsession\n", style="bold")
    row("requests", str(snap.requests))
    row("tokens", f"{snap.completion_tokens} out, {snap.prompt_tokens} in")
    row("cache hits", str(snap.cache_hits))
    row("routed", str(snap.route_decisions))
    row("errors", str(snap.errors))
    if snap.prediction_replies:  # replies asked with a prediction (code in the message), their tokens' fate
        row("prediction", f"{snap.prediction_accepted} accepted, {snap.prediction_rejected} rejected")
    t.append("\nmodels\n", style="bold")
    if info is None:
        row("backend", "loading…")
    else:
        row("target", terminal_safe(info.target))  # a server's model ids: untrusted
        row("draft", terminal_safe(info.draft or "–"))
        row("backend", f"{info.kind} · {info.accelerator}")
        if info.url:
            row("server", terminal_safe(info.url))
        ctx = f"{snap.last_context_tokens} / {info.n_ctx}" if info.n_ctx else str(snap.last_context_tokens)
        row("context", ctx)
    row("memory", f"RSS {_mb(rss_bytes)}")
    if snap.drift:
        t.append("\ndrift\n", style="bold yellow")
        for flag in snap.drift:
            t.append(f"{flag}\n", style="yellow")
    return t
