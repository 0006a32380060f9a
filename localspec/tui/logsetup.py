"""Keep every log line off the terminal the app draws on: send logging to a file instead.

llama.cpp writes to stderr unless its log callback is set, and Textual draws on stderr, so the
callback is installed before any model loads, and every stream handler is replaced by a file.
"""

from __future__ import annotations

import logging
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.paths import resolve_paths


def log_file() -> Path:
    return resolve_paths().data_dir / "logs" / "tui.log"


def route_logs_to_file(path: Path | None = None, level: int = logging.INFO) -> Path:
    """Replace the root logger's handlers with one file handler; returns the file."""
    from localspec.engine import llama_log

    path = path or log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:  # a file where the folder goes, a folder where the file goes, no permission
        raise LocalspecError(f"Cannot open the chat app's log file {path}: {exc.strerror or exc}.",
                             f"Make {path.parent} a folder you can write to (move aside what is there).") from None
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(min(root.level, level))
    logging.lastResort = handler  # loggers that do not propagate must not fall back to stderr
    # Loggers that kept their own stream handlers would still reach the terminal.
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            for h in list(logger.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    logger.removeHandler(h)
    logging.captureWarnings(True)
    llama_log.install()
    return path
