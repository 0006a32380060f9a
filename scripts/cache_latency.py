"""How long a cache hit takes end to end through the endpoint (issue goal: <= 50 ms).

Starts the endpoint on loopback (the 1.5B target, semantic cache on, a temporary home), asks
each prompt once to fill the cache, then repeats exact and paraphrased requests through the
official `openai` client and reports the wall time per hit: once with the reuse judge (the
default: the 1.5B confirms each semantic hit) and once without it (`--no-cache-judge`). The
paraphrases are also asked right after an uncached answer to another prompt
(`semantic_after_generation`), so that the slot holds other work. Run it with nothing else
generating:

    python scripts/cache_latency.py [--repeats 10] [--out docs/reliability/cache_latency.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS = [
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("What is the capital of France?", "What's the capital of France?"),
    ("How do I create a new branch in git?", "How can I create a branch in git?"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import os

    os.environ.setdefault("LOCALSPEC_MODELS_DIR", str(_shared_store()))  # before moving the home
    os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="localspec-latency-")
    import openai

    from localspec.server import ServerSettings, create_app
    from tests.server_harness import ServerThread, request, wait_until

    report: dict = {}
    for judge in (True, False):
        os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="localspec-latency-")  # an empty cache each
        report["judged" if judge else "rules_only"] = _measure(judge, args.repeats, ServerSettings, create_app,
                                                               ServerThread, request, wait_until, openai)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _measure(judge: bool, repeats: int, ServerSettings, create_app, ServerThread, request, wait_until, openai) -> dict:
    settings = ServerSettings(target="qwen2.5-coder-1.5b-instruct-q4_k_m", mode="off", parallel=1, n_ctx=1024,
                              n_threads=2, cache_semantic=True, cache_judge=judge, max_tokens_cap=64)
    with ServerThread(create_app(settings)) as srv:
        if not wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=300):
            raise SystemExit(request(srv.base_url, "GET", "/health").text)
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(model=settings.target, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=1, temperature=0, extra_body={"localspec": {"cache": False}})

        def ask(text: str):
            t0 = time.perf_counter()
            r = client.chat.completions.create(model=settings.target, messages=[{"role": "user", "content": text}],
                                               max_tokens=32, temperature=0)
            return (time.perf_counter() - t0) * 1000, r.model_extra["localspec"]["cache"]

        miss_ms = [ask(a)[0] for a, _ in PROMPTS]  # fills the cache
        results: dict[str, list[float]] = {"exact": [], "semantic": [], "semantic_after_generation": []}
        for _ in range(repeats):
            for a, b in PROMPTS:
                for kind, text in (("exact", a), ("semantic", b)):
                    ms, cache = ask(text)
                    if cache.get("status") == "hit":
                        results[kind].append(ms)
        # The usual case in a session: the engine's only slot has just answered something else, so
        # the judge's shared prompt is no longer in it (it comes back from the pinned copy).
        for n in range(repeats):
            for a, b in PROMPTS:
                client.chat.completions.create(model=settings.target, max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": f"Name a colour. ({n} {a})"}],
                                               extra_body={"localspec": {"cache": False}})
                ms, cache = ask(b)
                if cache.get("status") == "hit":
                    results["semantic_after_generation"].append(ms)
    report: dict = {"misses_ms": [round(m, 1) for m in miss_ms]}
    for kind, values in results.items():
        values.sort()
        report[kind] = {
            "hits": len(values), "of": repeats * len(PROMPTS), "p50_ms": round(statistics.median(values), 1) if values else None,
            "p95_ms": round(values[int(0.95 * (len(values) - 1))], 1) if values else None,
            "max_ms": round(values[-1], 1) if values else None,
        }
    return report


def _shared_store() -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().models_dir


if __name__ == "__main__":
    raise SystemExit(main())
