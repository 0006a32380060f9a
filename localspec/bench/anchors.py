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

from localspec.bench.hog import stop_process
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


def _server_cmd(binary: str, target: Path, draft: Path | None, cfg: dict, port: int, n_ctx: int,
                threads: int | None) -> list[str]:
    cmd = [binary, "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
           "-np", "1", "--no-webui", *cfg["args"]]
    if threads:
        cmd += ["-t", str(threads), "-tb", str(threads)]
    if cfg.get("draft") and draft:
        cmd += ["-md", str(draft)]
    return cmd


def _stop(proc: subprocess.Popen) -> None:
    stop_process(proc, timeout_s=20)


def _complete(base: str, name: str, prompt: str, suite: str, pid: int, rep: int, max_tokens: int) -> dict:
    """One greedy /completion of a rendered prompt; decode speed and drafts from llama-server's timings."""
    res = _post(base + "/completion", {
        "prompt": prompt, "n_predict": max_tokens, "temperature": 0.0,
        "cache_prompt": False, "seed": 0,
    })
    t = res.get("timings", {})
    return {
        "suite": suite, "prompt": pid, "rep": rep, "mode": f"llama-server:{name}", "engine": "llama-server",
        "tokens": t.get("predicted_n"), "tps": t.get("predicted_per_second") or 0.0,
        "ttft_ms": t.get("prompt_ms"), "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
    }


def _error(name: str, message: str, pid: int = -1, rep: int = 0) -> dict:
    return {"suite": "error", "prompt": pid, "rep": rep, "mode": f"llama-server:{name}", "engine": "llama-server",
            "tps": 0.0, "error": message}


def llama_server(
    binary: str, target: Path, draft: Path | None, configs: list[dict], prompts: list[tuple[str, int, str]],
    max_tokens: int, n_ctx: int, threads: int | None, template: str | None, tick: Callable[[str], None],
    *, with_off: bool = True,
) -> list[dict]:
    """Target-only (unless `with_off` is False: a pool ran it interleaved) plus each configuration; each is a
    fresh server process on 127.0.0.1."""
    runs: list[dict] = []
    for cfg in [{"name": "off", "args": [], "draft": False}][: int(with_off)] + list(configs):
        port = _free_port()
        proc = subprocess.Popen(_server_cmd(binary, target, draft, cfg, port, n_ctx, threads),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base, proc)
            for suite, pid, text in prompts:
                tick(f"{suite} #{pid} llama-server {cfg['name']}")
                runs.append(_complete(base, cfg["name"], rendered_prompt(template, text), suite, pid, 0, max_tokens))
        except Exception as exc:  # an anchor failing must not sink the bench; it is reported
            logger.warning("llama-server %s failed: %s", cfg["name"], exc)
            runs.append(_error(cfg["name"], str(exc)))
        finally:
            _stop(proc)
    return runs


class LlamaServerPool:
    """One llama-server per configuration (target-only first), all up for the whole run, so the bench
    can send each prompt to them between our own modes: their runs pair with ours in every repeat and
    see the same machine (a noisy run's hog included). An idle server waits without using a core, and
    the processes share the model files' pages through mmap.

    `with LlamaServerPool(...) as pool:` stops every server on any exit. A configuration that fails to
    start or dies is reported as an error row and skipped, never fatal."""

    def __init__(self, binary: str, target: Path, draft: Path | None, configs: list[dict], *, n_ctx: int,
                 threads: int | None) -> None:
        self.binary, self.target, self.draft = binary, target, draft
        self.configs = [{"name": "off", "args": [], "draft": False}, *configs]
        self.n_ctx, self.threads = n_ctx, threads
        self.errors: list[dict] = []  # error rows, for the bench's anchor_errors
        self._procs: dict[str, tuple[subprocess.Popen, str]] = {}  # mode -> (process, base URL)

    @property
    def modes(self) -> list[str]:
        """The run modes of the servers that are up, e.g. "llama-server:ngram-simple"."""
        return list(self._procs)

    def start(self) -> LlamaServerPool:
        try:
            self._start_all()
        except BaseException:  # Ctrl-C while loading: the servers already up must not outlive the bench
            self.close()
            raise
        return self

    def _start_all(self) -> None:
        # Started one after another: loading side by side on a small machine only slows each down.
        for cfg in self.configs:
            port = _free_port()
            proc = subprocess.Popen(_server_cmd(self.binary, self.target, self.draft, cfg, port, self.n_ctx,
                                                self.threads), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            base = f"http://127.0.0.1:{port}"
            try:
                _wait_ready(base, proc)
            except BaseException as exc:
                _stop(proc)  # not yet in _procs: close() would not see it
                if not isinstance(exc, Exception):
                    raise
                logger.warning("llama-server %s did not start: %s", cfg["name"], exc)
                self.errors.append(_error(cfg["name"], f"start: {exc}"))
                continue
            self._procs[f"llama-server:{cfg['name']}"] = (proc, base)

    def complete(self, mode: str, suite: str, pid: int, rep: int, prompt: str, max_tokens: int) -> dict:
        """A run row for `mode`'s server on this rendered prompt, or an error row (suite "error")."""
        name = mode.removeprefix("llama-server:")
        proc, base = self._procs[mode]
        try:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}")
            return _complete(base, name, prompt, suite, pid, rep, max_tokens)
        except Exception as exc:  # reported with the anchors' errors; our modes carry on
            logger.warning("llama-server %s failed on %s #%d: %s", name, suite, pid, exc)
            return _error(name, f"{suite} #{pid}: {exc}", pid, rep)

    def close(self) -> None:
        procs, self._procs = self._procs, {}
        for proc, _ in procs.values():
            _stop(proc)

    def __enter__(self) -> LlamaServerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
