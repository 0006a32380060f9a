"""What a LoRA on the target does to speculation: the draft has no adapter, so it proposes what the
bare model would say, and the target, answering as the adapted model, accepts less of it.

For each target (the 0.5B drafting for itself, and the 1.5B with the 0.5B), a synthetic random
rank-8 adapter (tests/gguf_factory.synthetic_lora, std 0.05 on every layer's attn_q and attn_v) is
applied at each scale; greedy draft-mode answers give the acceptance rate and the tokens per target
pass (steps whose draft stopped at draft_p_min count as passes too), and whether the answer differs
from the bare model's (the adapter is doing something).

    PYTHONPATH=. python scripts/lora_acceptance.py [--targets 0.5b,1.5b] [--scales 0.5,1] [--max-tokens 64]
        [--adapter PATH --targets 1.5b] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from localspec.engine.chat import ChatMessage
from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.bench.runner import run_request
from localspec.engine.events import Done
from localspec.engine.scheduler import Engine
from localspec.models import ModelManager, check_lora
from tests.common import DRAFT_ID, TARGET_ID
from tests.gguf_factory import synthetic_lora

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that debounces another function.",
    "Explain what a mutex is in two sentences.",
    "What is the difference between a process and a thread?",
    "Write a SQL query that returns the ten most recent orders with their customer names.",
    "Implement binary search in C.",
    "Write a Rust function that reverses a string.",
    "Write a haiku about compilers.",
]
TARGETS = {"0.5b": DRAFT_ID, "1.5b": TARGET_ID}


def answer(engine: Engine, prompt: str, max_tokens: int) -> tuple[list[int], Done]:
    request = GenerationRequest(messages=[ChatMessage(role="user", content=prompt)], max_tokens=max_tokens,
                                mode="draft")
    generated = run_request(engine, request)
    return list(generated.ids), generated.done


def measure(target: Path, draft: Path, adapter: Path | None, scale: float, max_tokens: int,
            threads: int) -> list[tuple[list[int], Done]]:
    config = EngineConfig(n_ctx=1024, n_threads=threads, mode="off", lora_path=str(adapter) if adapter else None,
                          lora_scale=scale)  # mode "off" at load: no calibration; each request asks for "draft"
    engine = Engine.load(str(target), str(draft), config)
    try:
        return [answer(engine, p, max_tokens) for p in PROMPTS]
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="0.5b,1.5b")
    ap.add_argument("--scales", default="0.5,1")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapter", type=Path, help="a real adapter for the (single) target, instead of the synthetic one")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    mm = ModelManager()
    draft = mm.require_path(DRAFT_ID)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.targets.split(","):
            target = mm.require_path(TARGETS[name])
            if args.adapter:
                check_lora(args.adapter, target)  # refused with the reason, as the engine would
                adapter = args.adapter
            else:
                adapter = synthetic_lora(target, Path(tmp) / f"{name}.gguf")
            bare = measure(target, draft, None, 1.0, args.max_tokens, args.threads)
            for scale in [None, *(float(s) for s in args.scales.split(","))]:
                runs = bare if scale is None else measure(target, draft, adapter, scale, args.max_tokens, args.threads)
                accepted = sum(d.stats.accepted for _, d in runs)
                drafted = sum(d.stats.drafted for _, d in runs)
                tokens = sum(d.stats.completion_tokens for _, d in runs)
                passes = sum(d.stats.target_passes for _, d in runs)
                changed = sum(ids != b for (ids, _), (b, _) in zip(runs, bare, strict=True))
                row = {"target": name, "adapter_scale": scale, "tokens": tokens, "target_passes": passes,
                       "accepted": accepted, "drafted": drafted,
                       "acceptance": round(accepted / drafted, 3) if drafted else None,
                       # the first token comes from the prompt's pass; the rest from the target's passes
                       "tokens_per_pass": round((tokens - len(runs)) / passes, 2) if passes else None,
                       "answers_changed": f"{changed}/{len(runs)}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
