"""The terminal chat app (Textual): chats, streamed replies, accepted-token view, metrics, models.

`run_app` is the entry point the CLI calls; `ChatApp` takes a backend factory, so the same app
runs the engine in-process, attaches to a server, or replays a recording.
"""

from localspec.tui.app import ChatApp
from localspec.tui.backend import Backend, BackendInfo, Generation, LocalBackend, RemoteBackend, ReplayBackend
from localspec.tui.session_metrics import SessionMetrics, SessionSnapshot
from localspec.tui.store import Chat, ChatParams, ChatStore, Message

__all__ = [
    "Backend", "BackendInfo", "Chat", "ChatApp", "ChatParams", "ChatStore", "Generation", "LocalBackend",
    "Message", "RemoteBackend", "ReplayBackend", "SessionMetrics", "SessionSnapshot",
]
