"""An edit task: a file and an instruction, as chat messages, with the file as the prediction.

The model is asked for the whole edited file in one fenced block, and the prediction is the file
in that same fence: an edit that changes a few lines then copies the rest at the speed of a
verify pass, since every unchanged token was already proposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from localspec.engine.chat import ChatMessage

SYSTEM = (
    "You edit files. Apply the user's instruction to the file and reply with the whole edited file "
    "in one fenced code block, and nothing else: no explanation, and nothing left out or elided."
)

# Fence labels by suffix; anything else gets a bare fence, which every model also writes.
LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".ts": "typescript",
    ".tsx": "tsx", ".jsx": "jsx", ".rs": "rust", ".go": "go", ".c": "c", ".h": "c", ".cc": "cpp",
    ".cpp": "cpp", ".hpp": "cpp", ".java": "java", ".kt": "kotlin", ".rb": "ruby", ".php": "php",
    ".cs": "csharp", ".swift": "swift", ".sh": "bash", ".bash": "bash", ".sql": "sql", ".html": "html",
    ".css": "css", ".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".md": "markdown",
    ".lua": "lua", ".r": "r", ".scala": "scala", ".hs": "haskell", ".ex": "elixir", ".zig": "zig",
}


def fence_for(text: str) -> str:
    """Three backticks, or more when the file itself holds a run of three (a Markdown file with
    code blocks): the fence must not be closed by the file's own lines."""
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


@dataclass(frozen=True)
class EditTask:
    name: str  # the file's name as the model sees it (no directories: they say nothing it needs)
    text: str
    instruction: str

    @property
    def language(self) -> str:
        return LANGUAGES.get(PurePath(self.name).suffix.lower(), "")

    @property
    def fence(self) -> str:
        return fence_for(self.text)

    def fenced(self, text: str) -> str:
        body = text if text.endswith("\n") or not text else text + "\n"
        return f"{self.fence}{self.language}\n{body}{self.fence}"

    def messages(self) -> list[ChatMessage]:
        user = f"{self.instruction.strip()}\n\nThe file `{self.name}`:\n{self.fenced(self.text)}"
        return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=user)]

    def prediction(self) -> str:
        """The reply we expect when little changes: the file, fenced as the prompt fenced it."""
        return self.fenced(self.text)
