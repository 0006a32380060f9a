"""The fenced code blocks of the docs, which of them the docs test runs, and what counts as an answer.

The rule, also written in docs/clients.md ("How these examples are tested"):
- a ```bash block with `curl` in it and a ```python block that uses `openai` (or `ollama`, `anthropic`) are run;
- a block whose last non-blank line before the fence is `<!-- not run: REASON -->` is not, and is counted;
- any other bash or python block is an error: it must be made runnable or marked.
Before running, two strings change and nothing else: the documented address and model name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

DOC_ADDRESS = "127.0.0.1:8000"
DOC_MODEL = "qwen-coder-1.5b"  # the default profile's target, as the docs name it
TEST_MODEL = "qwen-coder-0.5b"  # what the test server serves
EXECUTABLE_LANGS = {"bash", "sh", "shell", "console", "python", "py"}

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")


class Kind(Enum):
    CURL = "curl"
    PYTHON = "python"
    NOT_RUN = "not run"
    UNMARKED = "unmarked"  # executable-looking, neither runnable nor marked: an error
    OTHER = "other"  # yaml, plain text: nothing to execute


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason the docs give, when marked

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def kind(self) -> Kind:
        if self.not_run is not None:
            return Kind.NOT_RUN
        if self.lang == "bash" and re.search(r"\bcurl\s", self.code):
            return Kind.CURL
        if self.lang == "python" and re.search(r"\b(openai|ollama|anthropic)\b", self.code):
            return Kind.PYTHON
        return Kind.UNMARKED if self.lang in EXECUTABLE_LANGS else Kind.OTHER

    def for_server(self, port: int) -> str:
        """The code as run against the test server: the documented address and model swapped."""
        return self.code.replace(DOC_ADDRESS, f"127.0.0.1:{port}").replace(DOC_MODEL, TEST_MODEL)


def parse_blocks(text: str, path: str) -> list[Block]:
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a code fence that is never closed")
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _NOT_RUN.match(before)
        found.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           marker.group("reason") if marker else None))
        i = end + 1
    return found


def blocks_of(root: Path, paths: list[str]) -> list[Block]:
    return [b for p in paths for b in parse_blocks((root / p).read_text(encoding="utf-8"), p)]


def _choice_text(choice: dict) -> str:
    message = choice.get("message") or choice.get("delta") or {}
    return (message.get("content") if isinstance(message, dict) else None) or choice.get("text") or ""


def answer_in(stdout: str, kind: Kind) -> str:
    """The answer text a block printed: a completion JSON (OpenAI's, or llama-server's `content`), an SSE
    stream ending in [DONE], or (for Python) plain text. Empty when it printed none of these."""
    out = stdout.strip()
    try:
        body = json.loads(out)
    except ValueError:
        body = None
    if isinstance(body, dict):
        if "choices" not in body and isinstance(body.get("content"), str):  # llama-server's /infill, /completion
            return body["content"]
        return "".join(_choice_text(c) for c in body.get("choices") or [])
    events = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
    if events:
        if events[-1] != "[DONE]":
            return ""
        chunks = [json.loads(e) for e in events[:-1]]
        return "".join(_choice_text(c) for chunk in chunks for c in chunk.get("choices") or [])
    return out if kind is Kind.PYTHON else ""
