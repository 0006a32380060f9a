"""Route llama.cpp's own log output into Python logging.

Without this, llama.cpp writes straight to stderr, which tears the screen of a TUI that owns the
terminal. The callback is installed once per process and kept referenced (ctypes would free it).
"""

from __future__ import annotations

import logging
import threading

import llama_cpp

logger = logging.getLogger("localspec.llama_cpp")

# ggml log levels: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont (continues the last line).
# llama.cpp's warnings are mostly about model files we cannot change (e.g. token types), so they
# go to INFO; its errors stay errors.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR}
_lock = threading.Lock()
_installed = None
_pending: list[str] = []
_pending_level = logging.DEBUG


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, _user_data) -> None:  # pragma: no cover - called from C
    global _pending_level
    msg = text.decode("utf-8", errors="replace") if text else ""
    if level != 5:
        _pending_level = _LEVELS.get(level, logging.DEBUG)
    _pending.append(msg)
    if msg.endswith("\n"):
        line = "".join(_pending).rstrip("\n")
        _pending.clear()
        if line:
            logger.log(_pending_level, line)


def install() -> None:
    """Idempotent: send llama.cpp's log to the `localspec.llama_cpp` logger."""
    global _installed
    with _lock:
        if _installed is None:
            llama_cpp.llama_log_set(_on_log, None)
            _installed = _on_log
