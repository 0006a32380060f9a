"""Chat app vs `localspec generate`: answer speed on the same engine, prompt and mode, interleaved.

For each mode the script loads the engine once, then alternates A B A B: A runs the request the
way `localspec generate` does (`engine.generate`, tokens written out as they come), B sends the
same prompt through the chat app (headless, Textual's pilot, an in-process `LocalBackend` on that
engine, no cache so every reply is generated). Both report the engine's decode tok/s (the figure
the reply footer and `generate` print) and the wall-clock tok/s from request to last token. On a
busy box only the ratios of neighbouring runs mean much.

    PYTHONPATH=. python scripts/bench_faces.py --modes off draft --rounds 3 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROMPT = "Write a Python function that merges two sorted lists into one sorted list, with a docstring."


@dataclass(frozen=True)
class Run:
    face: str  # "generate" | "chat"
    mode: str
    tokens: int
    decode_tps: float  # the engine's own figure: tokens after the first / decode time
    wall_tps: float  # tokens / (request to last token)


def _request(mode: str, max_tokens: int):
    from localspec.engine.config import GenerationRequest
    from localspec.engine.sampling import SamplingParams

    return GenerationRequest(messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
                             sampling=SamplingParams(temperature=0.0), mode=mode)


def run_generate(engine, mode: str, max_tokens: int) -> Run:
    """What `localspec generate --chat` does after loading: iterate the engine, write each token."""
    from localspec.engine.events import Done, Token

    out, done, t0 = io.StringIO(), None, time.perf_counter()
    for event in engine.generate(_request(mode, max_tokens)):
        if isinstance(event, Token):
            out.write(event.text)
        elif isinstance(event, Done):
            done = event
    wall = time.perf_counter() - t0
    assert done is not None and done.finish_reason in ("stop", "length"), done
    s = done.stats
    return Run("generate", mode, s.completion_tokens, s.tokens_per_second, s.completion_tokens / wall)


def run_backend(engine, mode: str, max_tokens: int) -> Run:
    """The chat app's path without the app: the same `LocalBackend` (pipeline, step thread), read
    on this thread. The gap between this face and `generate` is the pipeline's, not the view's."""
    from localspec.engine.events import Done, Token
    from localspec.tui import LocalBackend

    backend = LocalBackend(engine, target="bench", owns_engine=False)
    out, done, t0 = io.StringIO(), None, time.perf_counter()
    try:
        for event in backend.start(_request(mode, max_tokens)):
            if isinstance(event, Token):
                out.write(event.text)
            elif isinstance(event, Done):
                done = event
    finally:
        backend.close()
    wall = time.perf_counter() - t0
    assert done is not None and done.finish_reason in ("stop", "length"), done
    s = done.stats
    return Run("backend", mode, s.completion_tokens, s.tokens_per_second, s.completion_tokens / wall)


async def _until(pilot, predicate, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the chat app did not finish")
        await pilot.pause(0.2)  # the harness polls; the real app has no pilot


def run_chat(engine, mode: str, max_tokens: int) -> Run:
    """The same request through the chat app: typed into the store, streamed into the view."""
    from localspec.tui import ChatApp, ChatParams, ChatStore, LocalBackend
    from localspec.tui.store import stats_from_dict

    async def main() -> Run:
        with tempfile.TemporaryDirectory() as tmp:
            app = ChatApp(lambda _p, **_: LocalBackend(engine, target="bench", owns_engine=False),
                          store=ChatStore(Path(tmp) / "chats.sqlite"), memory_probe=lambda: 0,
                          export_dir=Path(tmp), new_chat_params=ChatParams(temperature=0.0, max_tokens=max_tokens,
                                                                           mode=mode))
            async with app.run_test(size=(120, 40)) as pilot:
                await _until(pilot, lambda: app.backend is not None)
                t0 = time.perf_counter()
                await app.send(PROMPT)
                await _until(pilot, lambda: not app.generating)
                wall = time.perf_counter() - t0
                reply = app.store.messages(app.chat_id)[-1]
        assert reply.meta.get("finish_reason") in ("stop", "length"), reply.meta
        s = stats_from_dict(reply.meta["stats"])
        return Run("chat", mode, s.completion_tokens, s.tokens_per_second, s.completion_tokens / wall)

    return asyncio.run(main())


FACES = {"generate": run_generate, "backend": run_backend, "chat": run_chat}


def bench(modes: list[str], faces: list[str], rounds: int, max_tokens: int,
          threads: int | None) -> list[tuple[int, Run]]:
    from localspec.engine import llama_log
    from localspec.service import open_engine

    llama_log.install()
    runs: list[tuple[int, Run]] = []
    for mode in modes:
        engine = open_engine(mode=mode, n_ctx=2048, n_threads=threads)
        try:
            run_generate(engine, mode, 8)  # warm: the first request pays one-time costs
            for r in range(rounds):
                # A B, then B A: no face always runs first.
                for face in faces if r % 2 == 0 else faces[::-1]:
                    run = FACES[face](engine, mode, max_tokens)
                    runs.append((r, run))
                    print(json.dumps(asdict(run)), flush=True)
        finally:
            engine.close()
    return runs


def summarize(runs: list[tuple[int, Run]]) -> dict[str, dict[str, float]]:
    """Per mode and face: median tok/s, and the median (min, max) over rounds of face ÷ generate
    within a round; a round's runs are neighbours, so a busy box moves both sides of its ratio."""
    out: dict[str, dict[str, float]] = {}
    for mode in dict.fromkeys(run.mode for _, run in runs):
        row: dict[str, float] = {}
        mine = [(r, run) for r, run in runs if run.mode == mode]
        for metric in ("decode_tps", "wall_tps"):
            by = {(r, run.face): getattr(run, metric) for r, run in mine}
            faces = list(dict.fromkeys(run.face for _, run in mine))
            for face in faces:
                row[f"{face}_{metric}"] = round(statistics.median(v for (_, f), v in by.items() if f == face), 2)
            # chat ÷ backend: what the view itself costs, the pipeline's share taken out.
            pairs = [(f, "generate") for f in faces if f != "generate"]
            pairs += [("chat", "backend")] if {"chat", "backend"} <= set(faces) else []
            for face, base in pairs:
                ratios = [by[(r, face)] / by[(r, base)] for r in sorted({r for r, _ in mine})]
                key = f"{face}_ratio_{metric}" if base == "generate" else f"{face}_vs_{base}_{metric}"
                row[key] = round(statistics.median(ratios), 3)
                row[f"{key}_min"] = round(min(ratios), 3)
                row[f"{key}_max"] = round(max(ratios), 3)
        out[mode] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["off", "draft"])
    parser.add_argument("--faces", nargs="+", default=["generate", "chat"], choices=sorted(FACES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    runs = bench(args.modes, args.faces, args.rounds, args.max_tokens, args.threads)
    print(json.dumps({"summary": summarize(runs)}, indent=1))


if __name__ == "__main__":
    main()
