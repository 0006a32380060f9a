"""Text that leaves over HTTP names files by their name, never by where they live on this machine."""

from __future__ import annotations

import re

# An absolute POSIX path of two or more parts, or a home-relative one; stops at quotes, spaces and
# brackets. Not inside a URL (after `:` or `/`), and not one of the server's own routes (/v1/...).
_PATH_RE = re.compile(r"(?:~|(?<![\w.:/])/(?!v1/))(?:[^\s'\"`()\[\],;]+/)+([^\s'\"`()\[\],;/]+)")


def redact_paths(text: str) -> str:
    """`Cannot read /home/ana/models/x.gguf` -> `Cannot read x.gguf`."""
    return _PATH_RE.sub(lambda m: m.group(1), text)
