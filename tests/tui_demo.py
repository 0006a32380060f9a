"""A recorded exchange and fixed machine figures: the README screenshot and the snapshot tests.

Test support, kept out of the package (nothing the product runs needs it). `tui_demo_reply.json`
holds the events the real default pair (Qwen2.5-Coder 1.5B + 0.5B draft, mode draft, greedy)
emitted for one prompt on a 2-core CPU, so token origins and stats are real but never change. Regenerate it with `PYTHONPATH=. python -m tests.tui_demo --record` (needs the models).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from localspec.engine.events import Done, Event, Stats, Token
from localspec.models import FitEstimate, ModelManager, ModelRow
from localspec.tui.backend import BackendInfo, ReplayBackend

RECORDING = Path(__file__).with_name("tui_demo_reply.json")
DEMO_RSS = 1_734_000_000  # bytes; stands in for psutil's reading so pictures do not vary
DEMO_FREE_RAM = 16_000_000_000
DEMO_INFO = BackendInfo(
    kind="in-process", target="qwen2.5-coder-1.5b-instruct-q4_k_m", draft="qwen2.5-coder-0.5b-instruct-q4_k_m",
    accelerator="CPU", n_ctx=4096, profile="default",
)


def load_recording(path: Path = RECORDING) -> tuple[str, list[Event]]:
    """The recorded prompt and its events."""
    data = json.loads(path.read_text(encoding="utf-8"))
    events: list[Event] = []
    for e in data["events"]:
        if "token" in e:
            events.append(Token(e["token"], tuple(e["ids"]), e["origin"]))
        else:
            stats = Stats(**{k: v for k, v in e["stats"].items() if k in Stats.__dataclass_fields__})
            events.append(Done(e["done"], stats, e["text"]))
    return data["prompt"], events


def demo_backend(delay: float = 0.0) -> ReplayBackend:
    _, events = load_recording()
    return ReplayBackend([events], info=DEMO_INFO, delay=delay)


def fixed_model_rows() -> list[ModelRow]:
    """The registry's models with a fixed install state and fit, independent of this machine."""
    mgr = ModelManager()
    profile = mgr.profile(None)
    installed = set(profile.model_ids(include_embedding=True))
    rows = []
    for entry in mgr.registry.models.values():
        size = entry.expected_size()
        fit = None
        if entry.id in installed and size:
            kv = 0 if entry.role == "embedding" else 117_000_000
            total = size + kv + 300_000_000
            fit = FitEstimate(size, kv, 300_000_000, 4096, DEMO_FREE_RAM, None, "none",
                              "fits in RAM" if total < DEMO_FREE_RAM else "too large")
        rows.append(ModelRow(
            id=entry.id, role=entry.role, family=entry.family, quant=entry.quant, aliases=tuple(entry.aliases),
            installed=entry.id in installed, size=size, path=None, source=None, fit=fit,
        ))
    return rows


def record(path: Path = RECORDING, prompt: str | None = None, max_tokens: int = 160) -> None:
    """Run the real default pair once and store its events."""
    from localspec.engine import llama_log
    from localspec.engine.config import GenerationRequest
    from localspec.service import open_engine

    llama_log.install()
    prompt = prompt or load_recording(path)[0]
    engine = open_engine(n_ctx=1024, mode="draft")
    events = []
    try:
        request = GenerationRequest(messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
        for ev in engine.generate(request):
            if isinstance(ev, Token):
                events.append({"token": ev.text, "ids": list(ev.ids), "origin": ev.origin})
            else:
                events.append({"done": ev.finish_reason, "stats": ev.stats.to_dict(), "text": ev.text})
    finally:
        engine.close()
    path.write_text(json.dumps({"prompt": prompt, "events": events}, indent=0) + "\n", encoding="utf-8")


async def drive_demo(app, pilot, show_metrics: bool = True, show_origins: bool = False) -> None:
    """Send the recorded prompt, wait for the whole reply, open the panes asked for."""
    from tests.tui_support import wait_for

    await wait_for(pilot, lambda: app.backend is not None, what="the backend")
    app.query_one("#prompt").cursor_blink = False  # a blinking cursor would make pictures differ
    prompt, _ = load_recording()
    await app.send(prompt)
    await wait_for(pilot, lambda: not app.generating, what="the reply")
    if show_metrics:
        await app.chat_screen.run_action("toggle_metrics")
    if show_origins:
        await app.chat_screen.run_action("toggle_origins")
    app.query_one("#messages").scroll_home(animate=False)
    await pilot.pause()


def save_screenshot(out: Path, size: tuple[int, int] = (130, 40)) -> Path:
    """Export the chat screen (metrics pane and accepted-token view on) as SVG."""
    import asyncio
    import tempfile

    from localspec.tui.app import ChatApp
    from localspec.tui.store import ChatStore

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            app = ChatApp(lambda _p, **_: demo_backend(), store=ChatStore(Path(tmp) / "chats.sqlite"),
                          memory_probe=lambda: DEMO_RSS, model_rows=fixed_model_rows)
            async with app.run_test(size=size) as pilot:
                await drive_demo(app, pilot, show_metrics=True, show_origins=True)
                out.write_text(app.export_screenshot(title="localspec chat"), encoding="utf-8")

    asyncio.run(main())
    return out


if __name__ == "__main__":  # pragma: no cover - a maintenance tool
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="re-record the reply with the real models")
    parser.add_argument("--prompt")
    parser.add_argument("--screenshot", type=Path, help="write the SVG screenshot here")
    args = parser.parse_args()
    if args.record:
        record(prompt=args.prompt)
    if args.screenshot:
        print(save_screenshot(args.screenshot))
