"""Sentence embeddings from a GGUF embedding model (MiniLM) through llama.cpp.

One runtime for generation and embeddings. The engine package owns this so the cache and the
router can both use it without importing each other.

MiniLM is a non-causal BERT with a 512-position window. llama.cpp aborts the whole process when a
non-causal batch holds more tokens than n_ubatch, so the window is the batch size and a text that
does not fit is refused here (``embed`` returns None) and never reaches llama.cpp.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine import llama_log

if TYPE_CHECKING:
    from llama_cpp import Llama

WINDOW = 512  # MiniLM's positions; also n_ctx, n_batch and n_ubatch
# Recent texts' vectors are kept: a cache lookup embeds the new prompt, and its judge (the pair
# scorer) then needs that vector and the saved prompt's again. 256 vectors of 384 floats: 400 KB.
# They are keyed by a digest of the text, never the text: a client's long inputs must not stay in memory.
RECENT = 256


def _text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap identity for a model file: its size and the hash of its first and last MiB, or of all
    of it when it is no bigger than those two (a small file, an adapter, is hashed whole).

    Hashing a multi-GB GGUF takes seconds; a different file (another quant, a re-conversion)
    differs in size or in its header and metadata, which sit in the first MiB.
    """
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with p.open("rb") as fh:
        if size <= 2 << 20:
            h.update(fh.read(2 << 20))
        else:
            h.update(fh.read(1 << 20))
            fh.seek(size - (1 << 20))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:32]


class Embedder:
    """Mean-pooled, L2-normalised sentence vectors (float32). Thread-safe; one text at a time."""

    def __init__(self, model_path: str | os.PathLike[str], n_threads: int | None = 2, window: int = WINDOW) -> None:
        import llama_cpp  # heavy import only when an embedder is actually built

        llama_log.install()
        self.model_path = Path(model_path)
        self.window = window
        self.fingerprint = file_fingerprint(self.model_path)
        self._lock = threading.Lock()
        self._recent: OrderedDict[bytes, np.ndarray | None] = OrderedDict()
        self._llm: Llama | None = llama_cpp.Llama(
            model_path=str(self.model_path), embedding=True, n_ctx=window, n_batch=window,
            n_ubatch=window, n_threads=n_threads, n_threads_batch=n_threads, verbose=False,
        )
        self.dim = int(self._model().n_embd())

    def count_tokens(self, text: str) -> int:
        """Tokens including the [CLS]/[SEP] the model adds."""
        with self._lock:
            return len(self._model().tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def fits(self, text: str) -> bool:
        return 0 < self.count_tokens(text) <= self.window

    def truncated(self, text: str) -> str:
        """The longest start of `text` that fits the window, cut at a space where one is near (Ollama's
        `truncate`). Searched by its length in characters: a window of tokens is at most a few
        characters each, so only the first few KB are ever tokenized."""
        with self._lock:
            llm = self._model()

            def fits(n: int) -> bool:
                return len(llm.tokenize(text[:n].encode("utf-8"), add_bos=True, special=False)) <= self.window

            lo, hi = 0, min(len(text), self.window * 64)  # lo fits; past hi, nothing need be read
            if fits(hi):
                return text[:hi]
            while hi - lo > 1:  # the longest start that fits (counts grow with the length, near enough)
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        space = text.rfind(" ", 0, lo + 1)
        return text[:space] if space > lo - 64 else text[:lo]  # not half a word, where a space is near

    def embed(self, text: str) -> np.ndarray | None:
        """The unit vector for `text`, or None when it is empty or longer than the window."""
        key = _text_key(text)
        with self._lock:
            if key in self._recent:
                self._recent.move_to_end(key)
                vec = self._recent[key]
                return None if vec is None else vec.copy()
            vec = self._embed(text)
            self._recent[key] = vec
            if len(self._recent) > RECENT:
                self._recent.popitem(last=False)
        return None if vec is None else vec.copy()

    def _embed(self, text: str) -> np.ndarray | None:
        llm = self._model()
        n = len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        if n == 0 or n > self.window:
            return None
        raw = llm.embed(text, normalize=False, truncate=False)
        vec = np.asarray(raw, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self.dim:  # a model without pooling returns per-token rows: mean-pool them
            vec = np.asarray(raw, dtype=np.float32).reshape(-1, self.dim).mean(axis=0)
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else None

    def _model(self) -> Llama:
        if self._llm is None:  # closed: say so rather than fail on None inside llama-cpp-python
            raise RuntimeError(f"the embedder for {self.model_path.name} is closed")
        return self._llm

    def close(self) -> None:
        with self._lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
