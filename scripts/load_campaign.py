"""Hold the endpoint under load, then drop clients mid-stream, and check nothing leaks.

    .venv/bin/python scripts/load_campaign.py --clients 16 --duration 180 --out docs/reliability/load.json

Starts the endpoint in-process (the 0.5B model, 4 slots, a queue of 8, max_tokens 24) or loads
--url. Phase 1: `--clients` threads each stream requests back to back with the official openai
client for `--duration` seconds; a 429 must carry Retry-After (the client waits that long and
retries), anything else is an error. Phase 2, the disconnect storm: the same number of clients
open streams and hang up after a random number of chunks (some before the first). Meanwhile
/health is polled every 0.5 s and RSS sampled every second. Afterwards every slot must be idle
and /metrics must report queue depth 0. Reports TTFT and total latency percentiles, /health
latency, RSS start/peak/end and drift.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.loadtest import PROMPTS  # noqa: E402
from scripts.campaign_server import campaign_server, campaign_settings, isolate_home, slots_idle  # noqa: E402
from tests.server_harness import OpenStream, request, wait_until  # noqa: E402

KEY = "load-key"


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None}
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "p50": round(qs[49], 1), "p95": round(qs[94], 1), "p99": round(qs[98], 1),
            "max": round(max(values), 1)}


def rss_mb(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return 0.0


class Sampler(threading.Thread):
    """RSS every second and /health every half second, until stopped."""

    def __init__(self, base_url: str, pid: int) -> None:
        super().__init__(daemon=True)
        self.base_url, self.pid = base_url, pid
        self.rss: list[tuple[float, float]] = []
        self.health_ms: list[float] = []
        self.health_failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        last_rss = -1.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_rss >= 1.0:
                self.rss.append((round(now - t0, 1), round(rss_mb(self.pid), 1)))
                last_rss = now
            h0 = time.perf_counter()
            try:
                ok = request(self.base_url, "GET", "/health", timeout=30).status_code == 200
            except OSError:
                ok = False
            self.health_ms.append((time.perf_counter() - h0) * 1000)
            self.health_failures += not ok
            self.stop.wait(0.5)


def run_clients(client: Callable[[int], None], clients: int) -> float:
    """Run `client(i)` for i in 0..clients-1, each on its own thread; wall seconds until all end."""
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def steady_load(base_url: str, key: str, model: str, clients: int, duration: float, max_tokens: int) -> dict[str, Any]:
    import openai

    ttft: list[float] = []
    total: list[float] = []
    outcomes = {"completed": 0, "rejected_429": 0, "errors": 0, "429_without_retry_after": 0}
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + duration

    def client_loop(i: int) -> None:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=600)
        n = 0
        while n == 0 or time.monotonic() < deadline:  # every client sends at least one request
            prompt = f"{PROMPTS[(i + n) % len(PROMPTS)]} (client {i}, request {n})"
            n += 1
            t0 = time.perf_counter()
            first = None
            try:
                stream = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                    temperature=0.7, seed=n, stream=True, stream_options={"include_usage": True},
                )
                finished = False
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finished = True
                end = time.perf_counter()
                with lock:
                    if finished:
                        outcomes["completed"] += 1
                        total.append((end - t0) * 1000)
                        if first is not None:
                            ttft.append((first - t0) * 1000)
                    else:
                        outcomes["errors"] += 1
                        errors.append("stream ended without a finish_reason")
            except openai.RateLimitError as exc:
                retry = exc.response.headers.get("retry-after")
                with lock:
                    outcomes["rejected_429"] += 1
                    outcomes["429_without_retry_after"] += retry is None
                time.sleep(float(retry or 1))
            except Exception as exc:  # counted and reported, never fatal to the campaign
                with lock:
                    outcomes["errors"] += 1
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

    wall = run_clients(client_loop, clients)
    return {"clients": clients, "duration_s": round(wall, 1), "max_tokens": max_tokens, **outcomes,
            "errors_sample": errors[:10], "ttft_ms": percentiles(ttft), "total_ms": percentiles(total),
            "requests_per_minute": round(outcomes["completed"] / wall * 60, 1)}


def disconnect_storm(base_url: str, key: str, model: str, clients: int, rounds: int, max_tokens: int,
                     seed: int = 0) -> dict[str, Any]:
    """Each client opens streams and hangs up after 0..max_tokens/2 chunks, `rounds` times."""
    rng = random.Random(seed)
    plan = [[rng.randint(0, max(1, max_tokens // 2)) for _ in range(rounds)] for _ in range(clients)]
    counts = {"opened": 0, "dropped": 0, "rejected_429": 0, "other_status": 0, "errors": 0}
    lock = threading.Lock()

    def storm(i: int) -> None:
        for r, after in enumerate(plan[i]):
            body = {"model": model, "messages": [{"role": "user", "content": f"{PROMPTS[r % len(PROMPTS)]} #{i}.{r}"}],
                    "max_tokens": max_tokens, "temperature": 0.7, "stream": True}
            try:
                s = OpenStream(base_url, "/v1/chat/completions", key, body, timeout=600)
            except OSError:
                with lock:
                    counts["errors"] += 1
                continue
            with lock:
                if s.status_code == 200:
                    counts["opened"] += 1
                elif s.status_code == 429:
                    counts["rejected_429"] += 1
                else:
                    counts["other_status"] += 1
            seen = 0
            if s.status_code == 200:
                for line in s.lines():
                    if seen >= after:
                        break
                    seen += line.startswith("data: ")
            s.close()
            with lock:
                counts["dropped"] += s.status_code == 200
            if s.status_code == 429:
                time.sleep(0.5)

    seconds = run_clients(storm, clients)
    return {"clients": clients, "rounds": rounds, "seconds": round(seconds, 1), **counts}


def queue_depth(base_url: str, key: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    text = request(base_url, "GET", "/metrics", key).text
    for fam in text_string_to_metric_families(text):
        if fam.name == "localspec_queue_depth":
            return fam.samples[0].value
    return None


def main() -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of steady load")
    ap.add_argument("--storm-rounds", type=int, default=4, help="streams each client drops in the storm")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--model", default="auto")
    ap.add_argument("--out", type=Path, default=Path("docs/reliability/load.json"))
    args = ap.parse_args()

    isolate_home()
    settings = campaign_settings(KEY, parallel=args.parallel, max_queue=args.max_queue, max_tokens_cap=args.max_tokens,
                                 embeddings=False)
    with campaign_server(settings) as srv:
        base = srv.base_url
        sampler = Sampler(base, os.getpid())
        sampler.start()
        # One request per client first, so the start RSS includes the weights and warm buffers.
        warm = steady_load(base, KEY, args.model, args.clients, 0, args.max_tokens)
        rss_start = rss_mb(os.getpid())
        steady = steady_load(base, KEY, args.model, args.clients, args.duration, args.max_tokens)
        rss_after_steady = rss_mb(os.getpid())
        storm = disconnect_storm(base, KEY, args.model, args.clients, args.storm_rounds, args.max_tokens)
        idle = wait_until(lambda: slots_idle(srv) and srv.app.state.admission.unfinished() == 0, timeout=300)
        depth = queue_depth(base, KEY)
        # After the storm the server must still serve a normal request.
        after = steady_load(base, KEY, args.model, 2, 0, args.max_tokens)
        sampler.stop.set()
        sampler.join()
        rss_end = rss_mb(os.getpid())
    peak = max(v for _, v in sampler.rss)
    result = {
        "server": settings.model_dump(exclude={"api_key"}),
        "steady": steady,
        "storm": storm,
        "warm_up": {"completed": warm["completed"], "errors": warm["errors"]},
        "after_storm": {"completed": after["completed"], "errors": after["errors"]},
        "slots_idle_after": idle,
        "queue_depth_after": depth,
        "health": {"polls": len(sampler.health_ms), "failures": sampler.health_failures,
                   "latency_ms": percentiles(sampler.health_ms)},
        "rss_mb": {"start": round(rss_start, 1), "after_steady": round(rss_after_steady, 1), "peak": round(peak, 1),
                   "end": round(rss_end, 1), "drift": round(rss_end - rss_start, 1),
                   "drift_pct": round((rss_end - rss_start) / rss_start * 100, 2)},
        "rss_samples": sampler.rss[:: max(1, len(sampler.rss) // 60)],
        "command": " ".join(["python", "scripts/load_campaign.py", *sys.argv[1:]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss_samples", "server")}, indent=2))
    ok = (idle and depth == 0 and steady["errors"] == 0 and steady["429_without_retry_after"] == 0
          and sampler.health_failures == 0 and storm["other_status"] == 0 and after["errors"] == 0
          and after["completed"] == 2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
