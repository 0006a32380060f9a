"""A thinking model's thought, apart from its answer: Qwen3, QwQ and DeepSeek-R1's distills answer
`<think>...</think>` first, and llama-server (its default --reasoning-format), Ollama and Anthropic
return that thought beside the content, not in it. Where the chat template's generation prompt
already opens the thought (ends with `<think>`, as DeepSeek-R1-Distill's does), the answer starts
inside it and holds only `</think>`: `opened` (the engine's Prompter.opens_thought). The endpoint
and the chat app show the thought apart with these."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str, *, opened: bool) -> tuple[str | None, str]:
    """(the thought, the content after it) of a whole answer; (None, text) as it is when it has no
    thought. The thought is stripped and so is the content's start (the model writes a blank line
    between them). An answer cut off inside its thought is all thought, with no content."""
    if not opened:
        rest = text.lstrip()
        if not rest.startswith(OPEN):
            return None, text
        text = rest[len(OPEN):]
    thought, closed, content = text.partition(CLOSE)
    return thought.strip(), content.lstrip() if closed else ""


class ThoughtSplit:
    """`split_reasoning` over a streamed answer: `feed` takes the answer's next text and returns what
    of (thought, content) may be sent now, so that what it sent is always a prefix of the whole
    answer's split. Held: leading whitespace and a partial `<think>` where the answer may yet start
    with one, a partial `</think>` and trailing whitespace in the thought (the thought is stripped),
    and whitespace after `</think>` (the content is left-stripped)."""

    def __init__(self, *, opened: bool) -> None:
        self._phase = "thought" if opened else "start"  # start | thought | after | content
        self._held = ""
        self._thought_sent = False  # some of the thought went out: its leading whitespace is gone

    @property
    def held(self) -> int:
        """How many characters of the answer so far it holds back: the rest has gone out (or was a
        marker, or whitespace the split strips)."""
        return len(self._held)

    def feed(self, text: str) -> tuple[str, str]:
        buf, self._held = self._held + text, ""
        thought = ""
        while True:
            if self._phase == "start":
                rest = buf.lstrip()
                if rest.startswith(OPEN):
                    buf, self._phase = rest[len(OPEN):], "thought"
                elif OPEN.startswith(rest):  # "", "<", "<th": may yet open a thought
                    self._held = buf
                    return thought, ""
                else:
                    self._phase = "content"
            elif self._phase == "thought":
                more, buf, closed = self._thought(buf)
                thought += more
                if not closed:
                    return thought, ""
                self._phase = "after"
            elif self._phase == "after":
                buf = buf.lstrip()
                if not buf:
                    return thought, ""
                self._phase = "content"
            else:
                return thought, buf

    def _thought(self, buf: str) -> tuple[str, str, bool]:
        """The thought that may go out of `buf`, what follows `</think>` (or is held), and whether it closed."""
        at = buf.find(CLOSE)
        body = buf[:at] if at >= 0 else buf[:len(buf) - marker_start(buf, CLOSE)]
        if not self._thought_sent:
            body = body.lstrip()  # the whitespace before it is stripped: gone, not held
        keep = body.rstrip()
        self._thought_sent = self._thought_sent or bool(keep)
        if at >= 0:
            return keep, buf[at + len(CLOSE):], True
        self._held = body[len(keep):] + buf[len(buf) - marker_start(buf, CLOSE):]
        return keep, "", False


def marker_start(text: str, marker: str) -> int:
    """The length of the longest end of `text` that `marker` starts with (but is not all of)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def answer_only(text: str, *, opened: bool) -> str:
    """An answer without its thought."""
    return split_reasoning(text, opened=opened)[1]
