"""Run by tests/test_tui_first_minute.py: the chat app, headless, streaming a long recorded reply
into the chat database at DB until the test kills this process (SIGKILL)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from localspec.engine.events import Done, Stats, Token
from localspec.tui import ChatApp, ChatStore, ReplayBackend
from tests.tui_support import wait_for

TOKENS = 20_000  # at DELAY apart: minutes of streaming, far longer than the test waits
DELAY = 0.01


def slow_reply(n: int = TOKENS) -> list:
    tokens = [Token(f"{i} ", (i,), "target") for i in range(n)]
    return [*tokens, Done("stop", Stats(mode="off", completion_tokens=n), "".join(t.text for t in tokens))]


async def main(db: Path) -> None:
    app = ChatApp(lambda _p, **_: ReplayBackend([slow_reply()], delay=DELAY), store=ChatStore(db),
                  memory_probe=lambda: 0, export_dir=db.parent / "exports")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        await app.send("count for ever")
        await wait_for(pilot, lambda: not app.generating, 3600, "the kill")  # the reply outlasts the test


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
