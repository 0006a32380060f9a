"""The anchors we compare against, run on the same prompts, models and thread count.

* llama-cpp-python's own prompt-lookup decoding (`Llama(draft_model=LlamaPromptLookupDecoding())`);
* llama.cpp's `llama-server` (binary on PATH or named by LLAMA_SERVER), started on loopback:
  target-only and the speculative configurations of the plan, fed the same rendered prompt
  through `/completion` with the same token budget; speed is read from its `timings`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from localspec.engine.chat import ChatMessage, render_chat

logger = logging.getLogger(__name__)


def rendered_prompt(template: str | None, prompt: str) -> str:
    return render_chat(template, [ChatMessage(role="user", content=prompt)])


def llama_cpp_python_lookup(
    target: Path, prompts: list[tuple[str, int, str]], max_tokens: int, n_ctx: int, threads: int | None,
    template: str | None, tick: Callable[[str], None],
) -> list[dict]:
    """prompts: (suite, prompt id, text). Greedy, streamed, decode tokens/s from stream timestamps."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from localspec.engine import llama_log

    llama_log.install()
    llm = llama_cpp.Llama(
        model_path=str(target), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), verbose=False,
        # A draft model makes Llama keep every row's logits, but 0.3.36 sizes its scores buffer from
        # this argument (n_batch rows when False), so prompts over 512 tokens fail without it.
        logits_all=True,
    )
    runs = []
    try:
        for suite, pid, text in prompts:
            tick(f"{suite} #{pid} llama-cpp-python lookup")
            llm.reset()
            t0 = time.perf_counter()
            stamps = []
            try:
                for _chunk in llm.create_completion(rendered_prompt(template, text), max_tokens=max_tokens,
                                                    temperature=0.0, stream=True):
                    stamps.append(time.perf_counter())
            except Exception as exc:  # e.g. its logits buffer on long prompts: reported, never fatal
                logger.warning("llama-cpp-python lookup failed on %s #%d: %s", suite, pid, exc)
                runs.append({"suite": "error", "prompt": pid, "rep": 0, "mode": "llama-cpp-python:lookup",
                             "engine": "llama-cpp-python", "tps": 0.0,
                             "error": f"{suite} #{pid}: {type(exc).__name__}: {exc}"})
                continue
            n = len(stamps)
            decode = stamps[-1] - stamps[0] if n > 1 else 0.0
            runs.append({
                "suite": suite, "prompt": pid, "rep": 0, "mode": "llama-cpp-python:lookup",
                "engine": "llama-cpp-python",
                "tokens": n, "tps": (n - 1) / decode if decode > 0 else 0.0,
                "ttft_ms": (stamps[0] - t0) * 1000 if stamps else None,
            })
    finally:
        llm.close()
    return runs


def find_llama_server() -> str | None:
    return os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


def llama_server(
    binary: str, target: Path, draft: Path | None, configs: list[dict], prompts: list[tuple[str, int, str]],
    max_tokens: int, n_ctx: int, threads: int | None, template: str | None, tick: Callable[[str], None],
) -> list[dict]:
    """Target-only plus each configuration; each is a fresh server process on 127.0.0.1."""
    runs: list[dict] = []
    for cfg in [{"name": "off", "args": [], "draft": False}, *configs]:
        port = _free_port()
        cmd = [binary, "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
               "-np", "1", "--no-webui", *cfg["args"]]
        if threads:
            cmd += ["-t", str(threads), "-tb", str(threads)]
        if cfg.get("draft") and draft:
            cmd += ["-md", str(draft)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base, proc)
            for suite, pid, text in prompts:
                tick(f"{suite} #{pid} llama-server {cfg['name']}")
                res = _post(base + "/completion", {
                    "prompt": rendered_prompt(template, text), "n_predict": max_tokens, "temperature": 0.0,
                    "cache_prompt": False, "seed": 0,
                })
                t = res.get("timings", {})
                runs.append({
                    "suite": suite, "prompt": pid, "rep": 0, "mode": f"llama-server:{cfg['name']}",
                    "engine": "llama-server",
                    "tokens": t.get("predicted_n"), "tps": t.get("predicted_per_second") or 0.0,
                    "ttft_ms": t.get("prompt_ms"), "drafted": t.get("draft_n",
                                                                    0), "accepted": t.get("draft_n_accepted", 0),
                })
        except Exception as exc:  # an anchor failing must not sink the bench; it is reported
            logger.warning("llama-server %s failed: %s", cfg["name"], exc)
            runs.append({"suite": "error", "prompt": -1, "rep": 0, "mode": f"llama-server:{cfg['name']}",
                         "engine": "llama-server", "tps": 0.0, "error": str(exc)})
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return runs
