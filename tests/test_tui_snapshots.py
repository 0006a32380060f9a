"""Pictures of the chat and models screens, fed a recorded reply with fixed figures.

The recording (tests/tui_demo_reply.json) carries the stats the engine measured once, and the
memory reading and fit estimates are fixed values, so the pictures depend on neither the clock
nor the machine. Update with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from localspec.tui import ChatApp, ChatStore
from tests.tui_demo import DEMO_RSS, demo_backend, drive_demo, fixed_model_rows
from localspec.tui.models_screen import ModelsScreen
from tests.tui_support import wait_for

SIZE = (130, 40)


def _app(tmp_path) -> ChatApp:
    return ChatApp(lambda _p, **_: demo_backend(), store=ChatStore(tmp_path / "chats.sqlite"),
                   memory_probe=lambda: DEMO_RSS, model_rows=fixed_model_rows, export_dir=tmp_path)


def test_chat_screen_with_metrics_pane(snap_compare, tmp_path):
    app = _app(tmp_path)

    async def run_before(pilot) -> None:
        await drive_demo(app, pilot, show_metrics=True)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_chat_screen_accepted_token_view(snap_compare, tmp_path):
    app = _app(tmp_path)

    async def run_before(pilot) -> None:
        await drive_demo(app, pilot, show_metrics=False, show_origins=True)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_models_screen(snap_compare, tmp_path):
    app = _app(tmp_path)

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), 10, "the models screen")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
