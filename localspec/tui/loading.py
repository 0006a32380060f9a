"""The chat app's loading state: progress from the loading thread, and the status line it shows."""

from __future__ import annotations

from textual.message import Message as TextualMessage

from localspec.engine.events import LoadProgress, LoadStage


class LoadProgressed(TextualMessage):
    """Posted from the loading thread (post_message is thread-safe) for each progress report.

    `load` numbers the load it belongs to, so a report from a load the app has since replaced
    (a profile switch) is ignored."""

    def __init__(self, progress: LoadProgress, load: int) -> None:
        super().__init__()
        self.progress = progress
        self.load = load


def loading_status(profile: str | None, progress: LoadProgress | None, queued: bool) -> str:
    """e.g. "Loading models (default profile)… qwen2.5-coder-1.5b 45% · 1.2 s · your message is queued"."""
    text = f"Loading models ({profile or 'default profile'})…"
    if progress is not None:
        what = ("calibrating speculative costs (one-time)" if progress.stage is LoadStage.CALIBRATE
                else f"{progress.model}")
        text += f" {what} {progress.fraction:.0%} · {progress.elapsed_s:.1f} s"
    if queued:
        text += " · your message is queued and is sent when they are ready (Esc cancels it)"
    return text


def calibrated_notice(progress: LoadProgress) -> str:
    return (f"Calibrated speculative costs in {progress.elapsed_s:.1f} s "
            "(once per model, llama.cpp build and thread count).")
