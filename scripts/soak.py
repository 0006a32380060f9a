"""Soak `localspec serve`: hours of mixed, gentle use, and whether the process stays healthy.

    .venv/bin/python scripts/soak.py --minutes 30 --json soak.json

A slow campaign, not for CI. Starts the real `localspec serve --port 0` (the active profile's
models, 2 slots, a queue of 2, max_tokens capped at 16, the semantic cache on) under a throwaway
LOCALSPEC_HOME that keeps the real model store, and drives it one request at a time with a mix of
every face: chat (plain, streamed, tools, json_schema with a new schema now and then), completions,
Responses chains (previous_response_id), Ollama's chat/generate/embed, OpenAI embeddings, streams
dropped mid-way, malformed bodies, keep_alive 0 (an unload and a reload), POST /v1/stop, small
bursts past admission (429s), /metrics and /v1/ps scrapes.

Every `--sample-s` seconds it samples the server process: RSS, open fds, threads, the bytes under
the data dir (metrics DB, cache), the series /metrics exposes, and a fixed probe request's latency
(cache off, greedy). The verdict compares the first samples with the last: a count that keeps
growing (fds, threads, series) or RSS that grows past warm-up is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from tests.serve_process import ServeProcess  # noqa: E402

PROBE = {"messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
         "max_tokens": 16, "temperature": 0, "localspec": {"cache": False}}
TOPICS = ["reverse a string", "sum a list", "read a file", "parse JSON", "sort a dict by value", "count words",
          "check a palindrome", "merge two lists", "flatten a list", "fizzbuzz", "fibonacci", "binary search"]
LANGS = ["Python", "Rust", "Go", "JavaScript", "C"]
SERVE_ARGS = ["--parallel", "2", "--max-queue", "2", "--n-ctx", "1024", "--threads", "2", "--max-tokens-cap", "16",
              "--cache-semantic", "--cache-judge", "scorer", "--keep-alive", "10m"]


# ---------------------------------------------------------------- the process, from outside


@dataclass(frozen=True)
class Sample:
    t_s: float
    requests: int
    rss_mb: float
    fds: int
    threads: int
    data_kb: int  # everything under LOCALSPEC_HOME
    metrics_db_kb: int
    series: int  # lines /metrics exposes (one per label set)
    biggest_family: str
    probe_ms: float


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def count_dir(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def tree_kb(root: Path) -> int:
    total = 0
    for p in root.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total // 1024


def series_by_family(text: str) -> Counter[str]:
    """Exposed series per metric family (a histogram's buckets count under its name)."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
                name = name.removesuffix(suffix)
            out[name] += 1
    return out


# ---------------------------------------------------------------- the load


@dataclass
class Tally:
    requests: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    def note(self, kind: str, status: int, ok: Callable[[int], bool] = lambda s: s == 200, detail: str = "") -> None:
        self.requests += 1
        self.by_kind[kind] += 1
        self.statuses[f"{kind}:{status}"] += 1
        if not ok(status) and len(self.unexpected) < 40:
            self.unexpected.append(f"{kind} {status} {detail[:200]}")


class Driver:
    """One client, one request at a time (bursts aside), drawing from the mix."""

    def __init__(self, base_url: str, rng: random.Random) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=300)
        self.base_url = base_url
        self.rng = rng
        self.tally = Tally()
        self.previous: str | None = None  # the Responses chain's last id
        self.n = 0
        models = self.http.get("/v1/models").json()["data"]
        ids = [m["id"] for m in models]
        self.embed_model = next((m for m in ids if "minilm" in m.lower()), None)
        self.model = next(m for m in ids if m != self.embed_model)

    def prompt(self) -> str:
        # About one prompt in three repeats an earlier one (exact hits); the rest are new (misses, stores).
        i = self.rng.randrange(40) if self.rng.random() < 0.35 else self.n
        return f"In {LANGS[i % len(LANGS)]}, {TOPICS[i % len(TOPICS)]} (variant {i})."

    def post(self, kind: str, path: str, body: object, ok: Callable[[int], bool] = lambda s: s == 200) -> httpx.Response:
        r = self.http.post(path, json=body)
        self.tally.note(kind, r.status_code, ok, r.text)
        return r

    def step(self) -> None:
        self.n += 1
        kinds: list[tuple[Callable[[], None], int]] = [
            (self.chat, 12), (self.chat_stream, 8), (self.chat_tools, 4), (self.chat_schema, 5),
            (self.completion, 5), (self.responses, 8), (self.ollama_chat, 6), (self.ollama_generate, 5),
            (self.embeddings, 4), (self.ollama_embed, 4), (self.dropped_stream, 4), (self.malformed, 4),
            (self.scrape, 3),
        ]
        weights = [w for _, w in kinds]
        self.rng.choices([k for k, _ in kinds], weights)[0]()
        if self.n % 97 == 0:
            self.keep_alive_zero()
        if self.n % 131 == 0:
            self.stop()
        if self.n % 61 == 0:
            self.burst()

    def tokens(self) -> int:
        return self.rng.randint(4, 16)

    def chat(self) -> None:
        self.post("chat", "/v1/chat/completions", {"model": self.model, "max_tokens": self.tokens(), "temperature": 0,
                                                  "messages": [{"role": "user", "content": self.prompt()}]})

    def chat_stream(self) -> None:
        body = {"model": self.model, "max_tokens": self.tokens(), "stream": True,
                "messages": [{"role": "user", "content": self.prompt()}]}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            text = "".join(r.iter_text())
            self.tally.note("chat_stream", r.status_code, detail="" if "[DONE]" in text else "no [DONE]: " + text)

    def chat_tools(self) -> None:
        tool = {"type": "function", "function": {"name": f"lookup_{self.n % 7}", "description": "Look a word up.",
                                                 "parameters": {"type": "object", "properties": {
                                                     "word": {"type": "string"}}, "required": ["word"]}}}
        self.post("chat_tools", "/v1/chat/completions", {
            "model": self.model, "max_tokens": 16, "tools": [tool], "temperature": 0,
            "messages": [{"role": "user", "content": f"Look up the word '{TOPICS[self.n % len(TOPICS)]}'."}]})

    def chat_schema(self) -> None:
        # A new schema most times: each one is a grammar to compile (and, if kept, to keep).
        name = f"field_{self.n}" if self.rng.random() < 0.7 else "answer"
        schema = {"type": "object", "properties": {name: {"type": "string"}, "n": {"type": "integer"}},
                  "required": [name]}
        self.post("chat_schema", "/v1/chat/completions", {
            "model": self.model, "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
            "messages": [{"role": "user", "content": self.prompt()}]})

    def completion(self) -> None:
        self.post("completion", "/v1/completions", {"model": self.model, "max_tokens": self.tokens(),
                                                    "prompt": f"# {self.prompt()}\ndef ", "temperature": 0})

    def responses(self) -> None:
        body: dict[str, object] = {"model": self.model, "max_output_tokens": self.tokens(), "input": self.prompt()}
        if self.previous and self.rng.random() < 0.7:
            body["previous_response_id"] = self.previous
        r = self.post("responses", "/v1/responses", body)
        self.previous = r.json().get("id") if r.status_code == 200 else None

    def ollama_chat(self) -> None:
        self.post("api_chat", "/api/chat", {"model": self.model, "stream": self.rng.random() < 0.5,
                                            "options": {"num_predict": self.tokens()},
                                            "messages": [{"role": "user", "content": self.prompt()}]})

    def ollama_generate(self) -> None:
        self.post("api_generate", "/api/generate", {"model": self.model, "stream": False, "prompt": self.prompt(),
                                                    "options": {"num_predict": self.tokens()}})

    def embeddings(self) -> None:
        if self.embed_model:
            self.post("embeddings", "/v1/embeddings", {"model": self.embed_model,
                                                       "input": [self.prompt(), self.prompt()]})

    def ollama_embed(self) -> None:
        if self.embed_model:
            self.post("api_embed", "/api/embed", {"model": self.embed_model, "input": self.prompt()})

    def dropped_stream(self) -> None:
        body = {"model": self.model, "max_tokens": 16, "stream": True, "localspec": {"cache": False},
                "messages": [{"role": "user", "content": self.prompt()}]}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            for _ in r.iter_raw():
                break  # hang up after the first bytes
        self.tally.note("dropped_stream", r.status_code)

    def malformed(self) -> None:
        bad = self.rng.choice([b"{not json", b'{"model": 3, "messages": "x"}', b'{"messages": []}',
                               b'{"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
                               b"[" * 5000 + b"]" * 5000])
        path = self.rng.choice(["/v1/chat/completions", "/api/chat", "/v1/responses", "/v1/embeddings"])
        r = self.http.post(path, content=bad, headers={"content-type": "application/json"})
        self.tally.note("malformed", r.status_code, lambda s: 400 <= s < 500, r.text)

    def scrape(self) -> None:
        for path in ("/metrics", "/v1/ps", "/api/ps", "/health"):
            r = self.http.get(path)
            self.tally.note("scrape", r.status_code, detail=path)

    def keep_alive_zero(self) -> None:
        """An unload once this request is done; the next request loads the models again."""
        self.post("keep_alive_0", "/api/generate", {"model": self.model, "stream": False, "prompt": self.prompt(),
                                                   "options": {"num_predict": 4}, "keep_alive": 0})

    def stop(self) -> None:
        self.post("stop", "/v1/stop", {"model": self.model})

    def burst(self) -> None:
        """Six streams at once against 2 slots + a queue of 2: some are 429s."""
        def one() -> None:
            body = {"model": self.model, "max_tokens": 8, "stream": True, "localspec": {"cache": False},
                    "messages": [{"role": "user", "content": self.prompt()}]}
            try:
                with httpx.stream("POST", self.base_url + "/v1/chat/completions", json=body, timeout=300) as r:
                    for _ in r.iter_raw():
                        pass
                self.tally.note("burst", r.status_code, lambda s: s in (200, 429))
            except httpx.HTTPError as exc:
                self.tally.note("burst", 0, lambda s: False, repr(exc))
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def probe_ms(self) -> float:
        """The fixed probe, twice (the first may pay a reload): the faster one."""
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            r = self.http.post("/v1/chat/completions", json={"model": self.model, **PROBE})
            times.append((time.perf_counter() - t0) * 1000)
            self.tally.note("probe", r.status_code, detail=r.text)
        return round(min(times), 1)

    def metrics_text(self) -> str:
        return self.http.get("/metrics").text


def sample(driver: Driver, pid: int, home: Path, t0: float) -> Sample:
    probe = driver.probe_ms()
    families = series_by_family(driver.metrics_text())
    db = home / "data" / "metrics.sqlite"
    db_kb = sum(p.stat().st_size for p in db.parent.glob("metrics.sqlite*")) // 1024 if db.exists() else 0
    biggest = families.most_common(1)[0] if families else ("", 0)
    return Sample(t_s=round(time.monotonic() - t0, 1), requests=driver.tally.requests, rss_mb=round(rss_mb(pid), 1),
                  fds=count_dir(f"/proc/{pid}/fd"), threads=count_dir(f"/proc/{pid}/task"), data_kb=tree_kb(home),
                  metrics_db_kb=db_kb, series=sum(families.values()), biggest_family=f"{biggest[0]}={biggest[1]}",
                  probe_ms=probe)


# ---------------------------------------------------------------- the verdict


def verdict(samples: list[Sample]) -> list[str]:
    """What grew between the first third's samples (after the first, warm-up) and the last third's."""
    if len(samples) < 4:
        return ["too few samples for a trend"]
    k = max(1, len(samples) // 3)
    early, late = samples[1:1 + k], samples[-k:]

    def med(xs: list[Sample], f: Callable[[Sample], float]) -> float:
        return statistics.median(f(s) for s in xs)

    found = []
    checks: list[tuple[str, Callable[[Sample], float], float]] = [
        # Threads come and go within bounds: the loop's executor (up to cores + 4) and anyio's workers
        # (gone after 10 s idle); 30 reload cycles in-process left the OS thread count where it was.
        ("fds", lambda s: s.fds, 4), ("threads", lambda s: s.threads, 4), ("series", lambda s: s.series, 10),
        ("rss_mb", lambda s: s.rss_mb, 150), ("probe_ms", lambda s: s.probe_ms, 0.0),
    ]
    for name, f, slack in checks:
        a, b = med(early, f), med(late, f)
        if name == "probe_ms":
            if b > 1.5 * a:
                found.append(f"probe latency drifted up: {a:.0f} -> {b:.0f} ms (median)")
        elif b - a > slack:
            found.append(f"{name} grew: {a:g} -> {b:g} (median, early vs late)")
    return found or ["healthy: no count grew beyond its slack, probe latency steady"]


def table(samples: list[Sample]) -> str:
    cols = ["t_s", "requests", "rss_mb", "fds", "threads", "data_kb", "metrics_db_kb", "series", "biggest_family",
            "probe_ms"]
    rows = [cols] + [[str(getattr(s, c)) for c in cols] for s in samples]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--pause-s", type=float, default=0.2, help="rest between requests (the machine is shared)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--home", type=Path, help="LOCALSPEC_HOME to use (default: a new temporary one)")
    ap.add_argument("--json", type=Path, help="also write the samples and verdict here")
    ap.add_argument("serve_args", nargs="*", help="extra `localspec serve` arguments (after --)")
    args = ap.parse_args(argv)

    from localspec.paths import resolve_paths

    env = dict(os.environ)
    env.setdefault("LOCALSPEC_MODELS_DIR", str(resolve_paths().models_dir))
    env.setdefault("LOCALSPEC_THREADS", "2")
    home = args.home or Path(tempfile.mkdtemp(prefix="localspec-soak-"))
    env["LOCALSPEC_HOME"] = str(home)
    argv_serve = [*SERVE_ARGS, *args.serve_args]
    samples: list[Sample] = []
    with ServeProcess(argv_serve, env=env, ready_timeout=600) as srv:
        assert srv._proc is not None
        pid = srv._proc.pid
        driver = Driver(srv.base_url, random.Random(args.seed))
        t0 = time.monotonic()
        samples.append(sample(driver, pid, home, t0))
        print(table(samples[-1:]), flush=True)
        end, next_sample = t0 + args.minutes * 60, t0 + args.sample_s
        while time.monotonic() < end:
            try:
                driver.step()
            except httpx.HTTPError as exc:
                driver.tally.note("transport", 0, lambda s: False, repr(exc))
            time.sleep(args.pause_s)
            if time.monotonic() >= next_sample:
                samples.append(sample(driver, pid, home, t0))
                print(table(samples[-1:]).splitlines()[-1], flush=True)
                next_sample = time.monotonic() + args.sample_s
        samples.append(sample(driver, pid, home, t0))
        families = dict(series_by_family(driver.metrics_text()))
        log_errors = [line for line in srv.lines if "Traceback" in line or " ERROR " in line or "ERROR:" in line]
    files = {str(p.relative_to(home)): p.stat().st_size for p in sorted(home.rglob("*")) if p.is_file()}
    found = verdict(samples)
    print("\n" + table(samples))
    print(f"\nrequests: {driver.tally.requests} in {samples[-1].t_s / 60:.1f} min; by kind: "
          f"{dict(driver.tally.by_kind)}")
    print("unexpected answers:", len(driver.tally.unexpected), *driver.tally.unexpected[:10], sep="\n  ")
    print("server log errors:", len(log_errors), *log_errors[:10], sep="\n  ")
    print("files after shutdown (bytes):", *(f"{v:>10}  {k}" for k, v in files.items()), sep="\n  ")
    print("verdict:", *found, sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join(["scripts/soak.py", *(argv if argv is not None else sys.argv[1:])]),
            "serve_args": argv_serve, "samples": [asdict(s) for s in samples],
            "requests": driver.tally.requests, "by_kind": dict(driver.tally.by_kind),
            "statuses": dict(driver.tally.statuses), "unexpected": driver.tally.unexpected,
            "server_log_errors": log_errors[:40], "files_after_shutdown": files,
            "metric_series_at_end": families, "verdict": found,
        }, indent=2) + "\n")
    return 0 if found[0].startswith("healthy") else 1


if __name__ == "__main__":
    sys.exit(main())
