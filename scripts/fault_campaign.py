"""Process-level faults: SIGTERM mid-generation, a model deleted while serving, corrupt DBs, killed downloads.

    .venv/bin/python scripts/fault_campaign.py --out docs/reliability/faults.json

Each fault runs against real processes (`python -m localspec serve`, the 0.5B model, a private
LOCALSPEC_HOME) and reports injected / survived with what was checked:

- sigterm_server: requests complete, a stream is cut by SIGTERM, the server restarts; the
  metrics DB passes `PRAGMA integrity_check` and holds every completed request id.
- sigterm_chat: a process writes chat turns (ChatStore) while generating with the engine and is
  SIGTERMed mid-reply; the chat DB is intact and holds every message it reported committed.
- model_deleted: the served model's file is deleted; the server keeps answering (weights are
  loaded, not mapped); a restart reports the missing model and the pull command on /health.
- corrupt_metrics_db / corrupt_cache: garbage in the metrics DB and the cache's diskcache DB
  before start; the server starts, serves, and moves the metrics file aside.
- killed_download: `models pull` from a fake Hub, SIGKILLed at random byte offsets, rerun; the
  file is complete and hash-verified, never a corrupt registration.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.campaign_server import SMALL_TARGET  # noqa: E402
from tests.server_harness import OpenStream, request, wait_until  # noqa: E402

KEY = "fault-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`python -m localspec serve` in a subprocess with its own LOCALSPEC_HOME."""

    def __init__(self, home: Path, models_dir: Path, log: Path) -> None:
        self.home, self.models_dir, self.log = home, models_dir, log
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, LOCALSPEC_HOME=str(self.home), LOCALSPEC_MODELS_DIR=str(self.models_dir),
                   PYTHONPATH=str(REPO), LOCALSPEC_THREADS="2")
        return env

    def start(self, wait_ok: bool = True) -> Serve:
        cmd = [sys.executable, "-m", "localspec", "serve", "--port", str(self.port), "--model", SMALL_TARGET,
               "--mode", "off", "--parallel", "2", "--n-ctx", "1024", "--threads", "2", "--api-key", KEY,
               "--max-tokens-cap", "256", "--no-pull", "--no-embeddings"]
        self.proc = subprocess.Popen(cmd, env=self.env(), cwd=REPO, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)

        def up() -> bool:
            try:
                code = request(self.base, "GET", "/health", timeout=5).status_code
            except OSError:
                return False
            return code == 200 or (not wait_ok and code == 503 and self.health()["status"] == "error")

        if not wait_until(up, timeout=600, interval=0.2):
            raise RuntimeError(f"server did not come up; log: {self.log.read_text()[-2000:]}")
        return self

    def health(self) -> dict:
        return request(self.base, "GET", "/health", timeout=10).json()

    def chat(self, text: str, max_tokens: int = 8) -> dict:
        r = request(self.base, "POST", "/v1/chat/completions", KEY, {
            "model": SMALL_TARGET, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    def term(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def metrics_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    finally:
        conn.close()


def shared_models_dir() -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().models_dir


# ---------------------------------------------------------------- faults


def sigterm_server(work: Path, rounds: int) -> dict[str, Any]:
    from localspec.metrics.store import default_db_path

    home = work / "home-sigterm"
    srv = Serve(home, shared_models_dir(), work / "sigterm.log")
    os.environ["LOCALSPEC_HOME"] = str(home)
    db = default_db_path()
    completed: set[str] = set()
    rounds_out = []
    for r in range(rounds):
        srv.start()
        for i in range(3):
            completed.add(srv.chat(f"Say {r}.{i}.")["id"])
        stream = OpenStream(srv.base, "/v1/chat/completions", KEY, {
            "model": SMALL_TARGET, "messages": [{"role": "user", "content": "Count slowly from 1 to 200."}],
            "max_tokens": 256, "temperature": 0, "stream": True})
        seen = 0
        for line in stream.lines():
            seen += '"content"' in line
            if seen >= 3:
                break
        t0 = time.monotonic()
        rc = srv.term()
        stream.close()
        rounds_out.append({"exit_code": rc, "shutdown_s": round(time.monotonic() - t0, 1), "chunks_before_term": seen})
    srv.start()  # and once more: the restarted server reads and extends the same DB
    completed.add(srv.chat("Say done.")["id"])
    srv.term()
    ids = metrics_ids(db)
    missing = sorted(completed - ids)
    check = integrity(db)
    # uvicorn shuts down gracefully, then re-raises the captured SIGTERM: exit status -15 is the clean path.
    graceful = srv.log.read_text(errors="replace").count("Application shutdown complete")
    clean = [x for x in rounds_out if x["exit_code"] in (0, -signal.SIGTERM)]
    ok = check == "ok" and not missing and graceful >= rounds + 1
    return {"injected": rounds, "survived": len(clean) if ok else 0, "graceful_shutdowns_logged": graceful,
            "rounds": rounds_out, "integrity_check": check, "completed_requests": len(completed),
            "missing_from_metrics_db": missing, "db": str(db.relative_to(home))}


CHAT_WRITER = r"""
import sys
from localspec.engine.config import GenerationRequest
from localspec.engine.chat import ChatMessage
from localspec.engine.events import Token
from localspec.service import open_engine
from localspec.tui.store import ChatStore
store = ChatStore()
engine = open_engine(target=sys.argv[1], mode="off", n_ctx=1024, n_threads=2, parallel=1)
chat = store.create_chat("sigterm")
for i in range(1000):
    m = store.add_message(chat.id, "user", f"Count from 1 to 50, turn {i}.")
    print("committed", m.id, flush=True)
    text = ""
    for ev in engine.generate(GenerationRequest(messages=[ChatMessage(role="user", content=m.content)], max_tokens=48)):
        if isinstance(ev, Token):
            text += ev.text
            print("token", flush=True)
    a = store.add_message(chat.id, "assistant", text, {"turn": i})
    print("committed", a.id, flush=True)
"""


def sigterm_chat(work: Path, rounds: int, seed: int) -> dict[str, Any]:
    home = work / "home-chat"
    env = dict(os.environ, LOCALSPEC_HOME=str(home), LOCALSPEC_MODELS_DIR=str(shared_models_dir()),
               PYTHONPATH=str(REPO), LOCALSPEC_THREADS="2")
    rng = random.Random(seed)
    committed: set[int] = set()
    out = []
    for _ in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", CHAT_WRITER, SMALL_TARGET], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        tokens, cut_after = 0, rng.randint(5, 80)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("committed"):
                committed.add(int(line.split()[1]))
            elif line.startswith("token"):
                tokens += 1
                if tokens >= cut_after:
                    break
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        for line in proc.stdout:  # anything printed before it died
            if line.startswith("committed"):
                committed.add(int(line.split()[1]))
        out.append({"tokens_before_term": tokens, "exit_code": rc})
    os.environ["LOCALSPEC_HOME"] = str(home)
    from localspec.tui.store import default_db_path

    db = default_db_path()
    check = integrity(db)
    conn = sqlite3.connect(db)
    present = {r[0] for r in conn.execute("SELECT id FROM messages")}
    conn.close()
    missing = sorted(committed - present)
    return {"injected": rounds, "survived": rounds if check == "ok" and not missing else 0, "rounds": out,
            "integrity_check": check, "messages_committed": len(committed), "missing_from_chat_db": missing}


def model_deleted(work: Path) -> dict[str, Any]:
    """A private store holding a hard link to the 0.5B: deleting the link leaves the shared file alone."""
    src_dir = shared_models_dir() / SMALL_TARGET
    store = work / "store-deleted"
    dst_dir = store / SMALL_TARGET
    dst_dir.mkdir(parents=True)
    manifest = json.loads((src_dir / "manifest.json").read_text())
    for f in manifest["files"]:
        target = dst_dir / Path(f["path"]).name
        try:
            os.link(f["path"], target)
        except OSError:  # another filesystem: copy
            import shutil

            shutil.copyfile(f["path"], target)
        f["path"] = str(target)
    (dst_dir / "manifest.json").write_text(json.dumps(manifest))
    srv = Serve(work / "home-deleted", store, work / "deleted.log").start()
    srv.chat("Say one.")
    for f in manifest["files"]:
        Path(f["path"]).unlink()
    still = [srv.chat(f"Say {i}.", max_tokens=8)["choices"][0]["finish_reason"] for i in range(3)]
    rc = srv.term()
    srv.start(wait_ok=False)
    health = srv.health()
    srv.term()
    detail = health.get("detail") or ""
    names = SMALL_TARGET in detail and "localspec models pull" in detail
    return {"injected": 1, "survived": int(len(still) == 3 and health["status"] == "error" and names),
            "answers_after_delete": still, "exit_code": rc, "restart_health": health}


def corrupt_dbs(work: Path) -> dict[str, Any]:
    from localspec.paths import resolve_paths

    home = work / "home-corrupt"
    os.environ["LOCALSPEC_HOME"] = str(home)
    paths = resolve_paths()
    srv = Serve(home, shared_models_dir(), work / "corrupt.log").start()
    srv.chat("Say hi.")
    srv.term()
    from localspec.metrics.store import default_db_path

    db = default_db_path()
    garbage = b"this is not a sqlite database " * 200
    db.write_bytes(garbage)
    for side in ("-wal", "-shm"):
        Path(str(db) + side).unlink(missing_ok=True)
    caches = [p for p in paths.cache_dir.rglob("cache.db")]
    for c in caches:
        c.write_bytes(garbage)
    srv.start()
    answers = [srv.chat(f"Say {i}.")["id"] for i in range(2)]
    srv.term()
    aside = sorted(p.name for p in db.parent.glob(db.name + ".corrupt-*"))
    ok = integrity(db) == "ok" and set(answers) <= metrics_ids(db) and bool(aside)
    return {"injected": 1 + len(caches), "survived": (1 if ok else 0) + (len(caches) if ok else 0),
            "metrics_moved_aside_to": aside, "cache_dbs_corrupted": len(caches), "requests_after": len(answers)}


def killed_download(work: Path, trials: int, seed: int) -> dict[str, Any]:
    from tests.fake_hf_server import FakeHub
    from tests.gguf_factory import make_gguf
    from tests.models_helpers import PULL_SCRIPT

    rng = random.Random(seed)
    data = make_gguf(work / "src.gguf", n_embd=64, n_layers=4, pad_floats=(3 << 20) // 4).read_bytes()
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    out = []
    for t in range(trials):
        home, store = work / f"home-dl-{t}", work / f"store-dl-{t}"
        (home / "config").mkdir(parents=True)
        hub = FakeHub()
        hub.add("acme/tiny-GGUF", "tiny.gguf", data)
        cut = rng.randint(1, len(data) - 1)
        hub.stall_first_get_after = cut
        hub.start()
        env = dict(os.environ, LOCALSPEC_HOME=str(home), LOCALSPEC_MODELS_DIR=str(store), PYTHONPATH=str(REPO),
                   HF_ENDPOINT=hub.url, HF_HOME=str(work / f"hf-{t}"), HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
        os.environ["LOCALSPEC_HOME"] = str(home)
        from localspec.paths import resolve_paths

        overlay = resolve_paths().user_registry
        overlay.parent.mkdir(parents=True, exist_ok=True)
        overlay.write_text('[[models]]\nid = "tiny-hf"\nrole = "target"\n  [[models.sources]]\n  kind = "hf"\n'
                           f'  repo = "acme/tiny-GGUF"\n  files = [{{ name = "tiny.gguf", sha256 = "{sha}" }}]\n')
        proc = subprocess.Popen([sys.executable, "-c", PULL_SCRIPT, "tiny-hf"], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        stalled = hub.stalled.wait(60)
        proc.kill()
        proc.wait(30)
        hub.release.set()
        registered_while_cut = (store / "tiny-hf" / "manifest.json").exists()
        rerun = subprocess.run([sys.executable, "-c", PULL_SCRIPT, "tiny-hf"], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=300)
        hub.stop()
        res = json.loads(rerun.stdout.strip().splitlines()[-1])
        complete = res.get("ok") and Path(res["path"]).read_bytes() == data
        out.append({"cut_at_byte": cut, "stalled": stalled, "registered_while_cut": registered_while_cut,
                    "rerun_ok": bool(complete)})
    survived = sum(1 for o in out if o["rerun_ok"] and not o["registered_while_cut"])
    return {"injected": trials, "survived": survived, "file_bytes": len(data), "trials": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("docs/reliability/faults.json"))
    ap.add_argument("--sigterm-rounds", type=int, default=3)
    ap.add_argument("--download-trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated fault names")
    args = ap.parse_args()
    os.environ.setdefault("LOCALSPEC_MODELS_DIR", str(shared_models_dir()))
    work = Path(tempfile.mkdtemp(prefix="localspec-faults-"))
    faults = {
        "killed_download": lambda: killed_download(work, args.download_trials, args.seed),
        "sigterm_server": lambda: sigterm_server(work, args.sigterm_rounds),
        "sigterm_chat": lambda: sigterm_chat(work, args.sigterm_rounds, args.seed),
        "model_deleted": lambda: model_deleted(work),
        "corrupt_dbs": lambda: corrupt_dbs(work),
    }
    wanted = args.only.split(",") if args.only else list(faults)
    results: dict[str, Any] = {}
    for name in wanted:
        t0 = time.monotonic()
        try:
            results[name] = faults[name]()
        except Exception as exc:  # a fault the campaign itself could not run is reported, not hidden
            results[name] = {"injected": 0, "survived": 0, "error": f"{type(exc).__name__}: {exc}"[:1000]}
        results[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(name, json.dumps(results[name])[:600], flush=True)
    total = {"injected": sum(r["injected"] for r in results.values()),
             "survived": sum(r["survived"] for r in results.values())}
    doc = {"total": total, "faults": results, "work_dir": str(work),
           "command": " ".join(["python", "scripts/fault_campaign.py", *sys.argv[1:]])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(total))
    return 0 if total["injected"] == total["survived"] and total["injected"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
