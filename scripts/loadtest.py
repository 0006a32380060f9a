"""Aggregate throughput of the endpoint under 1, 4 and 8 concurrent streaming clients vs sequential.

    python scripts/loadtest.py --parallel 8 --max-tokens 64 --mode off --threads 2

Starts `localspec serve`'s app in-process on a free loopback port (or uses --url), then for each
concurrency c sends the same c requests twice: all at once (c streaming clients) and one after
another. Aggregate tokens/s = completion tokens of those requests / wall time. A measurement
tool, not a test: numbers depend on the machine and whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash map works, with an example in Python.",
    "Describe the water cycle for a ten year old.",
    "Write a bash script that backs up a directory and explain each line.",
    "Explain the difference between TCP and UDP.",
    "Write a Python class for a bank account with deposit and withdraw.",
    "Describe how a compiler turns source code into machine code.",
    "Write a poem about the sea in the style of a sea shanty.",
]


def _one(client, model: str, prompt: str, max_tokens: int) -> int:
    n = 0
    for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True},
    ):
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return n


def _concurrent(client, model: str, prompts: list[str], max_tokens: int) -> tuple[int, float]:
    counts = [0] * len(prompts)

    def run(i: int) -> None:
        counts[i] = _one(client, model, prompts[i], max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def _sequential(client, model: str, prompts: list[str], max_tokens: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    total = sum(_one(client, model, p, max_tokens) for p in prompts)
    return total, time.perf_counter() - t0


def measure(base_url: str, key: str, model: str, levels: list[int], max_tokens: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=3600)
    _one(client, model, "Say hi.", 4)  # warm-up: page in the weights
    rows = []
    for c in levels:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(c)]
        n_conc, t_conc = _concurrent(client, model, prompts, max_tokens)
        n_seq, t_seq = _sequential(client, model, prompts, max_tokens)
        rows.append({
            "clients": c, "tokens": n_conc,
            "concurrent_tok_s": round(n_conc / t_conc, 2), "concurrent_s": round(t_conc, 2),
            "sequential_tok_s": round(n_seq / t_seq, 2), "sequential_s": round(t_seq, 2),
            "speedup": round((n_conc / t_conc) / (n_seq / t_seq), 2),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start one in-process)")
    ap.add_argument("--api-key", default="loadtest")
    ap.add_argument("--model", default="auto")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--mode", default="off")
    ap.add_argument("--profile")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.url:
        measure(args.url, args.api_key, args.model, levels, args.max_tokens)
        return

    import uvicorn

    from localspec.server import ServerSettings, create_app

    settings = ServerSettings(
        api_key=args.api_key, parallel=args.parallel, n_ctx=args.n_ctx, n_threads=args.threads, mode=args.mode,
        profile=args.profile, embeddings=False, max_queue=max(levels),
    )
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"{base}/health") as r:
                if r.status == 200:
                    break
        except Exception:
            time.sleep(0.5)
    try:
        measure(base, args.api_key, args.model, levels, args.max_tokens)
    finally:
        server.should_exit = True
        thread.join(timeout=60)


if __name__ == "__main__":
    main()
