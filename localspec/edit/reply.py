"""Read a model's reply back as the whole edited file, or say why it is not one.

The reply must hold exactly one fenced code block, closed, and the reply must have ended on its
own (not at the token limit). A line inside the block that elides code ("# ... rest unchanged",
a bare "...", "// rest of the file unchanged") and that the original file does not contain marks a
partial file: writing it would delete everything it stands for. So does a reply keeping fewer than
half the lines of a file of 10 or more (unless the caller allows it: "delete the tests" shrinks a
file on purpose). Prose around the one block is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE_OPEN = re.compile(r"^(?P<fence>`{3,}|~{3,})[^`\n]*$")
# A line that is only an elision: optional comment leader, "..." (or "…"), then optional words
# after a space ("...rest," is JavaScript's spread, not an elision), then an optional closer.
_ELISION = re.compile(
    r"^\s*(?:#|//|/\*|<!--|--|;|\*)?\s*(?:\.\.\.|…)"
    r"(?:\s+\(?\s*(?:the\s+)?(?:\d+\s+)?(?:rest|remaining|existing|unchanged|same|other|previous|omitted|more|code|"
    r"lines?)\b.*?)?\s*(?:\*/|-->)?\s*$",
    re.IGNORECASE,
)
# A comment that says code was left out, without an ellipsis: "# rest of the file unchanged".
_LEFT_OUT = re.compile(
    r"^\s*(?:#|//|/\*|<!--|--|;|\*)\s*(?:the\s+)?(?:rest|remainder)\s+of\s+(?:the\s+)?"
    r"(?:file|code|module|class|function|methods?)\b.*\b(?:unchanged|omitted|same|as before)\b",
    re.IGNORECASE,
)
# A reply keeping fewer lines than this share of the file's is taken for a part of it.
SHRINK_LIMIT = 0.5


class NotWholeFile(ValueError):
    """The reply cannot stand for the edited file; the message says how that was decided."""


@dataclass(frozen=True)
class Block:
    body: str
    start_line: int  # 1-based line of the opening fence in the reply


def fenced_blocks(reply: str) -> tuple[list[Block], bool]:
    """The reply's fenced blocks, and whether the last one was left open."""
    blocks: list[Block] = []
    lines = reply.split("\n")
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i].strip())
        if not opened:
            i += 1
            continue
        fence, start = opened.group("fence"), i
        close = next((j for j in range(i + 1, len(lines))
                      if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])),
                     None)
        if close is None:
            return blocks + [Block("\n".join(lines[start + 1:]), start + 1)], True
        # A block's text ends with the newline before its closing fence (how the prompt fenced the file).
        body = lines[start + 1:close]
        blocks.append(Block("\n".join(body) + "\n" if body else "", start + 1))
        i = close + 1
    return blocks, False


def extract_file(reply: str, *, original: str, finish_reason: str, max_tokens: int | None = None,
                 allow_shrink: bool = False) -> str:
    """The edited file the reply holds, with the original's final-newline convention."""
    if finish_reason == "length":
        limit = f" of {max_tokens} tokens" if max_tokens else ""
        raise NotWholeFile(f"the reply stopped at the token limit{limit} before the file ended; "
                           "raise --max-tokens")
    if finish_reason not in ("stop",):
        raise NotWholeFile(f"the reply ended with finish reason '{finish_reason}', not on its own")
    blocks, left_open = fenced_blocks(reply)
    if left_open:
        raise NotWholeFile(f"the code block opened on line {blocks[-1].start_line} of the reply is never closed")
    if not blocks:
        raise NotWholeFile("the reply has no fenced code block; the whole file must come in one")
    if len(blocks) > 1:
        raise NotWholeFile(f"the reply has {len(blocks)} code blocks (lines "
                           f"{', '.join(str(b.start_line) for b in blocks)}); a whole file comes in one")
    body = blocks[0].body
    known = {line.strip() for line in original.split("\n")}
    for n, line in enumerate(body.split("\n"), start=1):
        if line.strip() and (_ELISION.match(line) or _LEFT_OUT.match(line)) and line.strip() not in known:
            raise NotWholeFile(f"line {n} of the code block elides code ({line.strip()!r}), "
                               "which the file does not contain: the reply is a partial file")
    if not original.endswith("\n") and body.endswith("\n"):
        body = body[:-1]  # the fence needed a newline the file does not have
    if not allow_shrink:
        kept, had = len(body.splitlines()), len(original.splitlines())
        if had >= 10 and kept < SHRINK_LIMIT * had:
            raise NotWholeFile(f"the reply has {kept} lines where the file has {had} (under "
                               f"{SHRINK_LIMIT:.0%}), which looks like a part of the file; "
                               "--allow-shrink takes it as the whole")
    return body
