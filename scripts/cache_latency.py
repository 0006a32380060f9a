"""How long a cache hit takes end to end through the endpoint (issue goal: <= 50 ms).

Starts the endpoint on loopback (the 1.5B target, semantic cache on, a temporary home), asks
each prompt once to fill the cache, then asks exact repeats and paraphrases through the official
`openai` client and reports the wall time per hit, once for each way of confirming a semantic hit
(`--cache-judge`): the model (the default: the 1.5B confirms each semantic hit), the pair scorer,
and the guard's rules alone. Rows:

- `exact`: the cached prompt again;
- `semantic`: a paraphrase asked for the first time (with the judge: judged);
- `semantic_after_generation`: other paraphrases, each asked for the first time right after an
  uncached answer to another prompt, so that the slot holds other work;
- `semantic_remembered`: the `semantic` paraphrases asked again (with the judge: its remembered
  yes, no judgement).

Run it with nothing else generating:

    python scripts/cache_latency.py [--repeats 10] [--out docs/reliability/cache_latency.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# (cached prompt, paraphrases asked first time in `semantic`, others asked after a generation)
PROMPTS = [
    ("How do I reverse a list in Python?",
     ["How can I reverse a list in Python?", "What's the way to reverse a Python list?", "Reverse a list in Python - how?"],
     ["In Python, how do I reverse a list?", "python: reverse a list", "How to reverse a Python list?"]),
    ("What is the capital of France?",
     ["What's the capital of France?", "Which city is the capital of France?", "What city is France's capital?"],
     ["capital of France?", "Tell me the capital of France.", "What is France's capital city?"]),
    ("How do I create a new branch in git?",
     ["How can I create a branch in git?", "How do I make a new git branch?", "git: create a new branch"],
     ["What's the git command to create a new branch?", "How to create a new branch with git?",
      "Creating a new branch in git - how?"]),
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
    for judge, row in (("model", "judged"), ("scorer", "scorer"), ("rules", "rules_only")):
        os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="localspec-latency-")  # an empty cache each
        report[row] = _measure(judge, args.repeats, ServerSettings, create_app, ServerThread, request, wait_until,
                               openai)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _measure(judge: str, repeats: int, ServerSettings, create_app, ServerThread, request, wait_until, openai) -> dict:
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

        miss_ms = [ask(a)[0] for a, _, _ in PROMPTS]  # fills the cache
        results: dict[str, list[float]] = {"exact": [], "semantic": [], "semantic_after_generation": [],
                                           "semantic_remembered": []}
        asked = {"exact": 0, "semantic": 0, "semantic_after_generation": 0, "semantic_remembered": 0}

        def hit(kind: str, text: str) -> None:
            ms, cache = ask(text)
            asked[kind] += 1
            if cache.get("status") == "hit":
                results[kind].append(ms)

        for _, first, _ in PROMPTS:
            for b in first:
                hit("semantic", b)
        for _ in range(repeats):
            for a, first, _ in PROMPTS:
                hit("exact", a)
                for b in first:
                    hit("semantic_remembered", b)
        # The usual case in a session: the engine's only slot has just answered something else, so
        # the judge's shared prompt is no longer in it (it comes back from the pinned copy).
        for n, (_first, _, later) in enumerate(PROMPTS):
            for b in later:
                client.chat.completions.create(model=settings.target, max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": f"Name a colour. ({n} {b})"}],
                                               extra_body={"localspec": {"cache": False}})
                hit("semantic_after_generation", b)
    report: dict = {"misses_ms": [round(m, 1) for m in miss_ms]}
    for kind, values in results.items():
        values.sort()
        report[kind] = {
            "hits": len(values), "of": asked[kind], "p50_ms": round(statistics.median(values), 1) if values else None,
            "p95_ms": round(values[int(0.95 * (len(values) - 1))], 1) if values else None,
            "max_ms": round(values[-1], 1) if values else None,
        }
    return report


def _shared_store() -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().models_dir


if __name__ == "__main__":
    raise SystemExit(main())
